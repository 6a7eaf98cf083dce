"""Rater sessions: what the rater app does, without the web page (start a rater, show the next pair,
record an answer)."""
from __future__ import annotations

import sqlite3
import time
import uuid
from dataclasses import dataclass

import numpy as np

from .common import RatingError, StudyError, app_version, now_iso
from .store import RatingDB
from .study import Study, Trial

MAX_RATER_ID = 64


@dataclass
class Shown:
    trial: Trial
    left: np.ndarray  # (32,32,3)
    right: np.ndarray
    number: int  # 1-based position shown to the rater
    total: int
    banner: str
    token: str  # names this showing: an answer must quote it (a late second click cannot answer the next pair)


# An answer sooner than this after its pair was sent is a double press or a bouncing key, not a
# judgment: the server answers in ~10 ms, so a second press 30-400 ms after the first lands on
# the next pair. Refused, nothing recorded; the pair waits for a real answer.
MIN_ANSWER_MS = 500


class RatingService:
    """What the rater app does, without the web page: start a rater, show the next pair, record
    an answer. A session's state is a plain dict held by the caller (the app keeps it per tab)."""

    def __init__(self, study: Study, db_path=None, trials_per_rater: int | None = 100,
                 min_answer_ms: int = MIN_ANSWER_MS):
        self.study = study
        self.db = RatingDB(db_path or study.folder / "ratings.sqlite", study.study_id)
        self.db.check_writable()  # said now, not when the first rater arrives
        if trials_per_rater is not None and trials_per_rater < 0:
            raise StudyError(f"trials per rater must be >= 0 (0: the whole plan), got {trials_per_rater}")
        if min_answer_ms < 0:
            raise StudyError(f"the shortest answer time must be >= 0 ms, got {min_answer_ms}")
        self.trials_per_rater, self.min_answer_ms = trials_per_rater, min_answer_ms

    def target(self, seed: int) -> int:
        n = len(self.study.plan(seed))
        return n if not self.trials_per_rater else min(n, self.trials_per_rater)

    def begin(self, rater: str, consent: bool) -> dict:
        """Start (or resume) a rater; returns the session state."""
        rater = (rater or "").strip()
        if not rater:
            raise RatingError("enter your rater id to start")
        if len(rater) > MAX_RATER_ID or not rater.isprintable():
            raise RatingError(f"a rater id is at most {MAX_RATER_ID} printable characters")
        try:
            row = self.db.rater(rater)
            if row is None:
                if not consent:
                    raise RatingError("please read the information above and tick the consent box to start")
                self.db.add_rater(rater, self.study.rater_seed(rater))
                row = self.db.rater(rater)
            seed, _, practice_done = row
            session = self.db.new_session(rater)
        except sqlite3.Error as e:  # a full disk, a read-only file: nothing of the rater's is lost
            raise RatingError(f"the ratings database cannot be written to right now ({e}); please tell "
                              "the study's organiser, then press Start again") from e
        return {"study": self.study.study_id, "rater": rater, "session": session, "seed": seed,
                "practice": self.study.n_practice if practice_done else 0, "pending": None}

    def _check(self, state) -> dict:
        if not isinstance(state, dict) or not state.get("rater") or not state.get("session"):
            raise RatingError("no rating session (the page may be stale or the server restarted): "
                              "enter your rater id and press Start")
        if state.get("study") != self.study.study_id:
            raise RatingError("this page belongs to another study: reload the page")
        return state

    def progress(self, state) -> tuple[int, int]:
        state = self._check(state)
        done = self.db.judged_trials(state["rater"])
        return len(done), self.target(state["seed"])

    def show(self, state) -> Shown | None:
        """The pair to show now (practice first), or None when the rater has finished."""
        state = self._check(state)
        seed = state["seed"]
        if state["practice"] < self.study.n_practice:
            t = self.study.practice_plan(seed)[state["practice"]]
            number, total = t.index + 1, self.study.n_practice
            banner = f"Practice {number} of {total} (not recorded)"
        else:
            done = self.db.judged_trials(state["rater"])
            total = self.target(seed)
            t = next((t for t in self.study.plan(seed)[:total] if t.index not in done), None)
            if t is None:
                state["pending"] = None
                return None
            number = len(done) + 1
            banner = f"Pair {number} of {total}"
        token = uuid.uuid4().hex[:12]
        state["pending"] = {"index": t.index, "practice": t.practice, "shown_at": now_iso(),
                            "shown_mono": time.monotonic(), "token": token}
        return Shown(t, self.study.image(t.left, t.image), self.study.image(t.right, t.image),
                     number, total, banner, token)

    def answer(self, state, side: str, token: str | None = None) -> str:
        """Record the rater's choice for the pending pair; returns the acknowledgement to show.
        The judgment is committed to disk before this returns. token: the Shown.token the rater
        was looking at (None: the pending pair, for callers without a page)."""
        state = self._check(state)
        if side not in ("left", "right"):
            raise RatingError(f"unknown action {side!r}: choose 'left' or 'right'")
        p = state.get("pending")
        if not p:
            raise RatingError("no pair is waiting for an answer")
        if token is not None and token != p["token"]:
            raise RatingError("that answer was for a pair no longer on screen; nothing recorded")
        rt_ms = int(round((time.monotonic() - p["shown_mono"]) * 1000))
        if rt_ms < self.min_answer_ms:  # the pair stays on screen, waiting for a real answer
            try:
                self.db.refuse(state["rater"], state["session"], p["index"], p["practice"], rt_ms, self.min_answer_ms)
            except sqlite3.Error:
                pass  # the refusal is said either way; its record only helps the analysis
            raise RatingError(f"Too quick: that press came {rt_ms} ms after this pair appeared, too soon to be "
                              "a choice (a double press?). Any answer before it is recorded; this pair still "
                              "waits for yours.")
        if p["practice"]:
            if p["index"] + 1 >= self.study.n_practice:
                try:  # before the state moves on: a failed write leaves the pair waiting, as below
                    self.db.practice_done(state["rater"])
                except sqlite3.Error as e:
                    raise RatingError(f"the end of your practice could not be saved ({e}): please "
                                      "choose again") from e
            state["pending"] = None
            state["practice"] = p["index"] + 1
            if state["practice"] >= self.study.n_practice:
                return "Practice finished. The real pairs start now: your answers are recorded."
            return "Practice answer noted (not recorded)."
        t = self.study.plan(state["seed"])[p["index"]]
        chosen = t.left if side == "left" else t.right
        row = {"rater": state["rater"], "session": state["session"], "trial": t.index, "pair": t.pair,
               "image": t.image, "input_id": self.study.input_ids[t.image], "cond_a": t.a, "cond_b": t.b,
               "left_cond": t.left, "right_cond": t.right, "chosen_side": side, "chosen_cond": chosen,
               "rt_ms": rt_ms, "attention": int(t.attention), "shown_at": p["shown_at"],
               "answered_at": now_iso(), "app_version": app_version(),
               "weights": self.study.weights_version(t.a, t.b)}
        try:
            stored = self.db.record(row)
        except sqlite3.Error as e:  # the pair stays pending: the same click can be tried again
            raise RatingError(f"your answer could not be saved ({e}); nothing was recorded: "
                              "please choose again") from e
        state["pending"] = None  # only once the answer is on disk (or was already there)
        if not stored:
            return "That pair was already answered (in another window?); nothing changed."
        return f"Recorded answer {len(self.db.judged_trials(state['rater']))}."
