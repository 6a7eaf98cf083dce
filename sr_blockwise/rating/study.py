"""An opened study: a complete, verified study folder (its manifest checked against its images) and
each rater's plan of trials."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .common import FORMAT, StudyError
from .images import read_png, sha256_bytes

ATTENTION_EVERY = 10  # one attention check per this many trials


def damaged_files(folder: Path, files: dict[str, str]) -> list[str]:
    """The study images (relative path -> sha256) missing from `folder` or not as recorded."""
    return [rel for rel, sha in files.items()
            if not (folder / rel).is_file() or sha256_bytes((folder / rel).read_bytes()) != sha]


def read_manifest(folder: Path) -> dict:
    mpath = folder / "manifest.json"
    if not folder.is_dir():
        raise StudyError(f"no study folder at {folder} (make one with `sr-blockwise rate build`)")
    if not mpath.is_file():
        raise StudyError(f"{folder} is not a study folder: manifest.json is missing")
    try:
        m = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise StudyError(f"{mpath}: unreadable manifest ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or "settings" not in m:
        raise StudyError(f"{mpath}: not a rating study manifest (format {FORMAT})")
    return m


# ---------------------------------------------------------------- an opened study

@dataclass(frozen=True)
class Trial:
    index: int  # position in the rater's plan (practice trials: position in the practice list)
    pair: str  # what is compared, unique per rater
    image: int  # face index in the study
    a: str  # the compared conditions; preference is reported for a
    b: str
    left: str  # the condition shown on the left
    attention: bool = False
    practice: bool = False

    @property
    def right(self) -> str:
        return self.b if self.left == self.a else self.a


class Study:
    """A complete, verified study folder, images in memory."""

    def __init__(self, folder):
        self.folder = Path(folder)
        m = read_manifest(self.folder)
        if not m.get("complete"):
            raise StudyError(f"{self.folder}: the study build did not finish; run `sr-blockwise rate build` "
                             f"again with the same settings to complete it")
        s = m["settings"]
        try:
            expect = sha256_bytes(json.dumps({"settings": s, "files": m["files"]}, sort_keys=True).encode())[:16]
        except (KeyError, TypeError):
            raise StudyError(f"{self.folder}: manifest lacks its file list") from None
        if m.get("study_id") != expect:
            raise StudyError(f"{self.folder}/manifest.json was altered (its study id does not match its content)")
        bad = [f"{rel} {'altered' if (self.folder / rel).is_file() else 'missing'}"
               for rel in damaged_files(self.folder, m["files"])]
        if bad:
            raise StudyError(f"{self.folder}: {len(bad)} study image(s) missing or altered since the build "
                             f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); `sr-blockwise rate build` "
                             "with the study's settings makes them again")
        self.manifest = m
        self.study_id: str = m["study_id"]
        self.question: str = s["question"]
        self.seed: int = s["seed"]
        self.n_faces: int = s["n_faces"]
        self.n_practice: int = s["n_practice"]
        self.conditions: list[str] = [c["name"] for c in s["conditions"]]
        self.comparisons: list[tuple[str, str]] = [tuple(p) for p in s["comparisons"]]
        self.input_ids: list[int] = [f["input_id"] for f in s["faces"]]
        dirs = {c["name"]: c["dir"] for c in s["conditions"] if c["rule"] != "real"}
        dirs.update(real="images/real", broken="images/broken")
        n = self.n_faces + self.n_practice
        self.images = {c: np.stack([read_png(self.folder / d / f"{j:04d}.png") for j in range(n)])
                       for c, d in dirs.items()}
        self.weights = {c["name"]: c["weights"] for c in s["conditions"]}
        self.weights_sha = {k: v["sha256"] for k, v in s["weights"].items()}
        self._plans: dict[int, list[Trial]] = {}

    def image(self, cond: str, j: int) -> np.ndarray:
        return self.images[cond][j]

    def weights_version(self, *conds) -> str:
        """The weights behind some conditions, as label:sha256[:12] (what a judgment was made on)."""
        labels = sorted({self.weights[c] for c in conds if self.weights.get(c)})
        return ",".join(f"{w}:{self.weights_sha[w][:12]}" for w in labels)

    def identical(self, a: str, b: str, j: int) -> bool:
        return bool(np.array_equal(self.images[a][j], self.images[b][j]))

    def rater_seed(self, rater: str) -> int:
        h = hashlib.sha256(f"{self.study_id}:{self.seed}:{rater}".encode()).digest()
        return int.from_bytes(h[:8], "little") >> 1

    def plan(self, seed: int) -> list[Trial]:
        """A rater's trials in order: every (comparison, face) once, shuffled, sides random, and one
        attention check (real vs broken, a face not repeated) placed at random in every 10."""
        if seed in self._plans:
            return self._plans[seed]
        rng = np.random.default_rng(seed)
        main = [(a, b, j) for a, b in self.comparisons for j in range(self.n_faces)]
        main = [main[i] for i in rng.permutation(len(main))]
        att = [int(j) for j in rng.permutation(self.n_faces)]
        items = []
        step = ATTENTION_EVERY - 1
        for s in range(0, len(main), step):
            block = [(a, b, j, False) for a, b, j in main[s:s + step]]
            if att:
                block.insert(int(rng.integers(0, len(block) + 1)), ("real", "broken", att.pop(), True))
            items.extend(block)
        plan = []
        for i, (a, b, j, is_att) in enumerate(items):
            left = a if rng.random() < 0.5 else b
            pair = f"attention #{j}" if is_att else f"{a} vs {b} #{j}"
            plan.append(Trial(i, pair, j, a, b, left, is_att))
        self._plans[seed] = plan
        return plan

    def practice_plan(self, seed: int) -> list[Trial]:
        """Practice trials on faces kept out of the study: first real vs broken, then the comparisons."""
        rng = np.random.default_rng(seed + 1)
        out = []
        for i in range(self.n_practice):
            j = self.n_faces + i
            a, b = ("real", "broken") if i == 0 else self.comparisons[(i - 1) % len(self.comparisons)]
            out.append(Trial(i, f"practice #{i}", j, a, b, a if rng.random() < 0.5 else b, i == 0, True))
        return out


def open_study(folder) -> Study:
    return Study(folder)
