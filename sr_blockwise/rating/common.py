"""What every part of a rating study shares: the layout version, the errors, the timestamps and
the version a record names."""
from __future__ import annotations

from datetime import datetime, timezone

FORMAT = 1  # study folder / database layout version
RATING_VERSION = "rating/1"


class StudyError(ValueError):
    """A study folder or database that cannot be used; the message says why."""


class RatingError(ValueError):
    """A rater action that cannot be carried out; the message says why. Nothing was recorded."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def app_version() -> str:
    try:
        from importlib.metadata import version
        v = version("sr-blockwise")
    except Exception:
        v = "unknown"
    return f"sr-blockwise {v} {RATING_VERSION}"
