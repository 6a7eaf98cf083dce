"""What a batch run reports: the summary it prints, the per-image metrics file, and paths shown
safely in messages."""
from __future__ import annotations

import csv
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .files import _temp_name, _written_as

METRIC_FIELDS = ["input", "output", "relative", "status", "reason", "mode", "k", "eps", "temperature", "seed",
                 "batch_size", "prior_weight", "guard", "match_input", "calls", "mean_block", "seconds", "ground_truth", "psnr", "ssim",
                 "psnr_bicubic", "ssim_bicubic", "face", "framing", "box", "faces_note", "paste_scale"]


@dataclass
class Summary:
    total: int = 0  # jobs of this shard
    done: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    interrupted: bool = False
    blocks: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    seconds: float = 0.0  # processing time (reading, decoding, writing), model loading excluded
    load_seconds: float = 0.0
    greedy_check: dict | None = None
    no_face: list[str] = field(default_factory=list)  # photos skipped without a face (--no-face skip)
    faces: int = 0  # faces written (--faces all: several a photo)
    pasted: list[tuple[str, str]] = field(default_factory=list)  # --paste-back: (photo, its paste_plan's note)
    metrics_error: str | None = None  # the metrics file could not be written

    @property
    def left(self) -> int:
        """Inputs not processed (a run stopped early)."""
        return self.total - self.done - self.skipped - len(self.failed) - len(self.no_face)

    @property
    def exit_code(self) -> int:
        # a stop asked for after the last batch left nothing undone: not an interrupted run
        if self.interrupted and self.left:
            return 130
        return 1 if self.failed or self.metrics_error else 0

    def lines(self, mode: str) -> list[str]:
        left = self.left
        rate = self.done / self.seconds if self.seconds > 0 else 0.0
        out = [f"done {self.done}, skipped {self.skipped} (already there), failed {len(self.failed)}"
               + (f", no face found {len(self.no_face)}" if self.no_face else "")
               + (f", not processed {left} (interrupted: rerun with --skip-existing to finish)" if left else "")]
        if self.faces != self.done:
            out.append(f"faces written {self.faces}")
        out.append(f"time {self.seconds:.1f} s ({rate:.2f} images/s), model loading {self.load_seconds:.1f} s")
        if self.blocks:
            from ..model import SEQ_LEN  # greedy: one call per intensity (torch is loaded by now)
            calls = float(np.mean(self.calls))
            out.append(f"mean block size {np.mean(self.blocks):.2f} tokens/call, {calls:.0f} model calls per image"
                       + (f" ({SEQ_LEN / calls:.2f}x fewer than greedy)" if calls < SEQ_LEN else ""))
        g = self.greedy_check
        if g:
            same = "" if g["identical"] is None else (", outputs identical to greedy" if g["identical"]
                                                       else ", outputs DIFFER from greedy")
            out.append(f"speedup over greedy: {g['speedup']:.2f}x wall clock on the first batch of "
                       f"{g['images']} ({mode} {g['seconds']:.2f} s, greedy {g['greedy_seconds']:.2f} s){same}")
        if self.pasted:
            out.append("pasted back (the pasted photo's size: its scale):")
            out.extend(f"  {_shown(p)}: {_shown(note)}" for p, note in self.pasted[:50])
            if len(self.pasted) > 50:
                out.append(f"  ... and {len(self.pasted) - 50} more (see --metrics: paste_scale)")
        if self.no_face:
            out.append("no face found (not written):")
            out.extend(f"  {_shown(p)}" for p in self.no_face[:50])
        if self.failed:
            out.append("failed:")
            out.extend(f"  {_shown(p)}: {_shown(r)}" for p, r in self.failed[:50])
            if len(self.failed) > 50:
                out.append(f"  ... and {len(self.failed) - 50} more (see --metrics)")
        if self.metrics_error:
            out.append(f"metrics NOT written: {self.metrics_error}")
        return out


class Metrics:
    """Per-image rows in a .csv or .json file, rewritten atomically at the end and every minute.
    With --skip-existing, rows of the previous run for the skipped images are kept."""

    def __init__(self, path: str | None, settings: dict, skip_existing: bool, outdir: str = "."):
        self.path = Path(path) if path else None
        self.settings, self.rows, self.previous, self.last = settings, [], {}, time.time()
        self.outdir = os.path.abspath(outdir)
        if self.path and skip_existing and self.path.is_file():
            try:
                self.previous = {self.key(r): r for r in self._read() if r.get("status") == "done"}
            except (OSError, ValueError, KeyError, TypeError):
                self.previous = {}  # unreadable old metrics: start afresh

    def _read(self) -> list[dict]:
        if self.path.suffix == ".json":
            return json.loads(self.path.read_text())["images"]
        with open(self.path, newline="", encoding="utf-8", errors="surrogateescape") as f:
            return list(csv.DictReader(f))

    def key(self, row: dict) -> str:
        """What a resumed run matches rows by: the output's path relative to OUTDIR, the same
        however the inputs or OUTDIR are spelled. Rows of earlier versions have no `relative`:
        their output path, taken from the current folder, stands in."""
        if row.get("relative"):
            return row["relative"]
        return Path(os.path.relpath(os.path.abspath(row["output"]), self.outdir)).as_posix()

    def add(self, row: dict) -> None:
        if row["status"] == "skipped" and self.key(row) in self.previous:
            # the run that made it measured it (its row gains `relative` if it was an old one)
            row = {**self.previous[self.key(row)], "relative": row["relative"]}
        self.rows.append(row)

    def maybe_write(self, summary: Summary, every: float = 60.0) -> None:
        """The rows so far, every minute. A failed write (disk full...) is said once and the run
        goes on: the outputs matter more, and the final write tries again."""
        if time.time() - self.last > every:
            try:
                self.write(summary, finished=False)
            except OSError as e:
                if summary.metrics_error is None:
                    print(_shown(f"warning: metrics file {self.path}: {e}"), file=sys.stderr)
                summary.metrics_error = _shown(str(e))

    def write(self, summary: Summary, finished: bool = True) -> None:
        """The rows so far; a JSON file's summary says whether the run had finished (a periodic
        write's is of a run still going, or one killed before its final write)."""
        if not self.path:
            return
        self.last = time.time()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_name(self.path)
        with _written_as(tmp, self.path):
            if self.path.suffix == ".json":
                doc = {"settings": self.settings, "summary": {
                    "finished": finished, "done": summary.done, "skipped": summary.skipped, "failed": len(summary.failed),
                    "interrupted": bool(summary.interrupted and summary.left), "seconds": summary.seconds,
                    "mean_block": float(np.mean(summary.blocks)) if summary.blocks else None,
                    "greedy_check": summary.greedy_check}, "images": self.rows}
                tmp.write_text(json.dumps(doc, indent=1) + "\n")
            else:
                with open(tmp, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
                    w = csv.DictWriter(f, fieldnames=METRIC_FIELDS, extrasaction="ignore")
                    w.writeheader()
                    w.writerows(self.rows)
            os.replace(tmp, self.path)


def metrics_path(path: str | None, shard: tuple[int, int]) -> str | None:
    """Several shards must not write one metrics file: {shard} in the name is replaced by the
    shard index; without it, .shardI-of-N is inserted before the extension."""
    if not path:
        return None
    if Path(path).suffix not in (".csv", ".json"):
        raise ValueError(f"--metrics {path}: the file must end in .csv or .json")
    i, n = shard
    if "{shard}" in path:
        return path.replace("{shard}", str(i))
    if n > 1:
        p = Path(path)
        return str(p.with_name(f"{p.stem}.shard{i}-of-{n}{p.suffix}"))
    return path


def _printable(text: str) -> str:
    """File names that are not valid UTF-8 shown with their odd bytes escaped (caf\\xe9.png), as
    stderr shows them: printing them as they are can fail on stdout."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(32), *range(127, 160)]} | {9: "\\t", 10: "\\n", 13: "\\r"}


def _shown(path) -> str:
    """A path as a message shows it: control characters escaped (a newline in a name would split
    a line, an escape sequence would reach the terminal), odd bytes as _printable does."""
    return _printable(str(path).translate(_CONTROL))
