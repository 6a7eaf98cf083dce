"""Storage of the judgments: SQLite in WAL mode, synchronous=FULL, one transaction per judgment."""
from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing
from pathlib import Path

from .common import FORMAT, StudyError, app_version, now_iso

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS raters (
    rater TEXT PRIMARY KEY,
    seed INTEGER NOT NULL,
    consented_at TEXT NOT NULL,
    practice_done_at TEXT
);
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY,
    rater TEXT NOT NULL REFERENCES raters(rater),
    started_at TEXT NOT NULL,
    app_version TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS judgments (
    id INTEGER PRIMARY KEY,
    rater TEXT NOT NULL REFERENCES raters(rater),
    session TEXT NOT NULL REFERENCES sessions(session),
    trial INTEGER NOT NULL,
    pair TEXT NOT NULL,
    image INTEGER NOT NULL,
    input_id INTEGER NOT NULL,
    cond_a TEXT NOT NULL,
    cond_b TEXT NOT NULL,
    left_cond TEXT NOT NULL,
    right_cond TEXT NOT NULL,
    chosen_side TEXT NOT NULL CHECK (chosen_side IN ('left', 'right')),
    chosen_cond TEXT NOT NULL,
    rt_ms INTEGER NOT NULL,
    attention INTEGER NOT NULL,
    shown_at TEXT NOT NULL,
    answered_at TEXT NOT NULL,
    app_version TEXT NOT NULL,
    weights TEXT NOT NULL,
    UNIQUE (rater, pair),
    UNIQUE (rater, trial)
);
"""
# presses refused as too quick (RatingService.min_answer_ms): not judgments, but a rater who
# clicks through without looking shows in them; kept beside the judgments, never in their place
REFUSALS_SCHEMA = """
CREATE TABLE IF NOT EXISTS refusals (
    id INTEGER PRIMARY KEY,
    rater TEXT NOT NULL,
    session TEXT NOT NULL,
    trial INTEGER NOT NULL,
    practice INTEGER NOT NULL,
    rt_ms INTEGER NOT NULL,
    min_answer_ms INTEGER NOT NULL,
    at TEXT NOT NULL
)
"""
JUDGMENT_COLUMNS = ["id", "rater", "session", "trial", "pair", "image", "input_id", "cond_a", "cond_b",
                    "left_cond", "right_cond", "chosen_side", "chosen_cond", "rt_ms", "attention",
                    "shown_at", "answered_at", "app_version", "weights"]


class RatingDB:
    """The judgments of one study. One short connection per operation, so any number of server
    threads and processes can write; SQLite serialises the writers. create=False: an existing
    database opened to read (analysis), which is never written to, also on read-only storage."""

    def __init__(self, path, study_id: str, create: bool = True):
        self.path = Path(path)
        self.study_id = study_id
        self.read_only = not create
        if not self.path.exists() and not create:
            raise StudyError(f"no ratings database at {self.path} (nobody has rated yet: start `sr-blockwise rate serve`)")
        try:
            with closing(self.connect()) as con:
                if create:
                    con.execute("PRAGMA journal_mode=WAL")
                tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                if tables and "meta" not in tables or not tables and not create:
                    raise StudyError(f"{self.path} is not a ratings database (tables: {', '.join(sorted(tables)) or 'none'})")
                if not tables:
                    con.execute("BEGIN IMMEDIATE")
                    for stmt in SCHEMA.split(";"):
                        if stmt.strip():
                            con.execute(stmt)
                    con.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)",
                                    [("study_id", study_id), ("format", str(FORMAT)), ("created", now_iso())])
                    con.execute("COMMIT")
                row = con.execute("SELECT value FROM meta WHERE key='study_id'").fetchone()
                if create and row is not None and row[0] == study_id:
                    con.execute(REFUSALS_SCHEMA)  # also in databases made before the table existed
        except sqlite3.DatabaseError as e:
            raise StudyError(f"{self.path} is not a usable ratings database ({e})") from None
        if row is None or row[0] != study_id:
            raise StudyError(f"{self.path} holds judgments of another study ({row[0] if row else 'unknown'}), "
                             f"not of study {study_id}; give this study its own --db")

    def connect(self) -> sqlite3.Connection:
        if self.read_only:
            return self._connect_to_read()
        con = sqlite3.connect(self.path, timeout=30, isolation_level=None)  # we BEGIN/COMMIT ourselves
        con.execute("PRAGMA busy_timeout=30000")
        con.execute("PRAGMA synchronous=FULL")  # COMMIT returns once the judgment is on disk
        con.execute("PRAGMA foreign_keys=ON")
        return con

    def _connect_to_read(self) -> sqlite3.Connection:
        uri = self.path.resolve().as_uri()
        con = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=30, isolation_level=None)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return con
        except sqlite3.OperationalError as e:
            con.close()
            if "unable to open" not in str(e):  # e.g. locked: not a question of where it lies
                raise
        # a WAL database's reader needs its shared-memory file (NAME-shm) beside it, which read-only
        # storage cannot take. Without a write-ahead log the file itself holds every judgment and
        # reads as immutable (no lock files); with one, some may be only in the log
        wal = self.path.with_name(self.path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StudyError(f"{self.path} cannot be read in place (read-only storage?) and some judgments may be "
                             f"only in its write-ahead log {wal.name}: copy the folder somewhere writable and "
                             "analyze the copy")
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)

    def _write(self, sql: str, params=()) -> int:
        with closing(self.connect()) as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                n = con.execute(sql, params).rowcount
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:  # a failed COMMIT may have rolled back already
                    con.execute("ROLLBACK")
                raise
            return n

    def check_writable(self) -> None:
        """StudyError where judgments could not be written (a read-only file or folder): a write
        that is rolled back, so nothing changes."""
        try:
            with closing(self.connect()) as con:
                con.execute("BEGIN IMMEDIATE")
                try:
                    con.execute("UPDATE meta SET value=value WHERE key='study_id'")
                finally:
                    if con.in_transaction:  # a failed write may have rolled back already
                        con.execute("ROLLBACK")
        except sqlite3.Error as e:
            raise StudyError(f"{self.path}: judgments could not be written there ({e})") from None

    def rater(self, rater: str):
        with closing(self.connect()) as con:
            return con.execute("SELECT seed, consented_at, practice_done_at FROM raters WHERE rater=?",
                               (rater,)).fetchone()

    def add_rater(self, rater: str, seed: int) -> None:
        self._write("INSERT OR IGNORE INTO raters (rater, seed, consented_at) VALUES (?, ?, ?)",
                    (rater, seed, now_iso()))

    def practice_done(self, rater: str) -> None:
        self._write("UPDATE raters SET practice_done_at=? WHERE rater=? AND practice_done_at IS NULL",
                    (now_iso(), rater))

    def new_session(self, rater: str) -> str:
        session = uuid.uuid4().hex
        self._write("INSERT INTO sessions VALUES (?, ?, ?, ?)", (session, rater, now_iso(), app_version()))
        return session

    def judged_trials(self, rater: str) -> set[int]:
        with closing(self.connect()) as con:
            return {r[0] for r in con.execute("SELECT trial FROM judgments WHERE rater=?", (rater,))}

    def record(self, row: dict) -> bool:
        """One judgment in one transaction. False if this rater already judged this pair/trial."""
        cols = [c for c in JUDGMENT_COLUMNS if c != "id"]
        sql = (f"INSERT INTO judgments ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
               f"ON CONFLICT DO NOTHING")
        return self._write(sql, [row[c] for c in cols]) == 1

    def refuse(self, rater: str, session: str, trial: int, practice: bool, rt_ms: int, min_answer_ms: int) -> None:
        self._write("INSERT INTO refusals (rater, session, trial, practice, rt_ms, min_answer_ms, at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)", (rater, session, trial, int(practice), rt_ms, min_answer_ms, now_iso()))

    def refusals(self) -> list[dict]:
        """The refused presses; none in a database no server with the check has opened."""
        with closing(self.connect()) as con:
            con.row_factory = sqlite3.Row
            if not con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='refusals'").fetchone():
                return []
            return [dict(r) for r in con.execute("SELECT * FROM refusals ORDER BY id")]

    def judgments(self) -> list[dict]:
        with closing(self.connect()) as con:
            con.row_factory = sqlite3.Row
            return [dict(r) for r in con.execute(f"SELECT {', '.join(JUDGMENT_COLUMNS)} FROM judgments ORDER BY id")]
