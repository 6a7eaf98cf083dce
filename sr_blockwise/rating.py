"""Human rating studies: the paper's pairwise preference study (Table 3), run locally.

Raters see two 32x32 faces made from the same 8x8 input, in random order, and pick the one "more
likely taken by a camera". This module holds everything but the web page (apps/rating.py):

- build: decode every study face once per condition and write a study folder
      manifest.json          conditions, comparisons, weights sha256, settings, seed, face ids,
                             sha256 of every image; study_id = a hash of all of it
      images/<cond>/NNNN.png 32x32 outputs (images/real = the photos, images/broken = the
                             attention-check images); faces n..n+p-1 are for practice only
      ratings.sqlite         the judgments (default place)
- plans: each rater gets their own random trial order and left/right sides from a seed derived
  from the study seed and the rater id (the seed is recorded); about 1 trial in 10 is an
  attention check (the real photo against an obviously broken image).
- storage: SQLite in WAL mode, synchronous=FULL, one transaction per judgment, UNIQUE (rater, pair)
  so a rater never judges a pair twice. A judgment is only acknowledged after its COMMIT.
- analyze: preference per comparison with a 90% bootstrap interval (raters and images resampled),
  a two-sided binomial test, left-side bias, attention-check exclusion; Table 3 beside the paper.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import sqlite3
import time
import uuid
from collections import Counter
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from PIL import Image

FORMAT = 1  # study folder / database layout version
RATING_VERSION = "rating/1"
DEFAULT_QUESTION = "Which image is more likely to have been taken by a camera?"
FROZEN, FINETUNED = "cpu-frozen", "cpu-finetuned"  # default weights: greedy on frozen, k>1 fine-tuned
# the paper's rows: every k>1 fine-tuned condition against frozen k=1 greedy, plus the real photo
DEFAULT_CONDITIONS = ["greedy", "exact:k=2,4,6,8,10", "eps=2:k=2,4,6,8,10", "real"]
ATTENTION_EVERY = 10  # one attention check per this many trials
# Table 3 of the paper: preference (%) for the fine-tuned k>1 output over frozen greedy
PAPER_TABLE3 = {"exact": {2: 52.8, 4: 54.4, 6: 53.2, 8: 55.1, 10: 54.5},
                "eps=2": {2: 50.0, 4: 53.3, 6: 56.8, 8: 55.2, 10: 50.3}}
PAPER_FOOLED = 36.0  # Image Transformer paper: raters fooled by model output vs the real photo


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


# ---------------------------------------------------------------- conditions

@dataclass(frozen=True)
class Condition:
    spec: str  # decode mode (decoding.DecodeOptions.spec), or real / broken: photos, not decoded
    weights: str = ""  # weights label ("" for real / broken)

    @property
    def decoded(self) -> bool:
        return self.spec not in ("real", "broken")

    def options(self):
        from .decoding import DecodeOptions
        return DecodeOptions.parse(self.spec)

    @property
    def name(self) -> str:
        return f"{self.spec}@{self.weights}" if self.decoded else self.spec

    @property
    def rule(self) -> str:
        """greedy | exact | eps | topk | oracle | sample | real | broken: how the image is made."""
        if not self.decoded:
            return self.spec
        o = self.options()
        return "sample" if o.temperature > 0 else "greedy" if o.mode == "greedy" else o.rule

    @property
    def mode(self) -> str:
        """The spec's MODE (DecodeOptions.mode): greedy, exact, eps=E, sample, ... (Table 3's columns)."""
        return self.options().mode if self.decoded else self.spec

    @property
    def k(self) -> int:
        return self.options().k if self.decoded else 1

    @property
    def eps(self) -> int:
        return self.options().eps if self.decoded else 0

    @property
    def prior_weight(self) -> float:
        return self.options().prior_weight if self.decoded else 1.0

    @property
    def guard(self) -> float:
        return self.options().guard if self.decoded else 0.0

    @property
    def temperature(self) -> float:
        return self.options().temperature if self.decoded else 0.0

    @classmethod
    def from_name(cls, name: str) -> "Condition":
        (c,), _ = parse_conditions([name])
        return c


def weights_label(ref: str) -> str:
    """Short stable name for weights: the name itself, or a file's stem."""
    p = Path(ref)
    if "/" in ref or p.suffix in (".json", ".safetensors", ".pt"):
        return p.stem
    return ref


def _expand_k(mode: str) -> list[str]:
    """'exact:k=2,4,6' -> ['exact:k=2', 'exact:k=4', 'exact:k=6'] (a study's list of block sizes)."""
    parts = mode.split(":")
    at = [i for i, p in enumerate(parts) if p.strip().lower().startswith("k=") and "," in p]
    if not at:
        return [mode]
    i = at[0]
    return [":".join(parts[:i] + [f"k={k.strip()}"] + parts[i + 1:]) for k in parts[i][2:].split(",") if k.strip()]


def parse_conditions(specs, frozen: str = FROZEN, finetuned: str = FINETUNED) -> tuple[list[Condition], dict]:
    """Condition specs -> (conditions, {weights label: weights name or path}).
    A condition is a decode mode in the project's grammar (decoding.DecodeOptions.parse:
    greedy, exact:k=K, eps=E:k=K, sample:k=K:T=T, ... with :w=G for input guidance), K may be a
    list (exact:k=2,4,6), then @W for the weights; or `real`, the photo. Without @W, greedy uses
    the frozen weights and every other mode the fine-tuned ones (the paper's comparison; sampling
    at k=1 and k>1 on the same weights, so both have the same distribution)."""
    from .decoding import DecodeOptions
    conds, refs = [], {}
    for spec in specs:
        spec = spec.strip()
        if spec == "real":
            conds.append(Condition("real"))
            continue
        mode, at, ref = spec.partition("@")
        if at and not ref.strip():
            raise StudyError(f"condition {spec!r}: say the weights after @ (a name in weights/ or a .json path)")
        for one in _expand_k(mode):
            try:
                opts = DecodeOptions.parse(one)
            except ValueError as e:
                photo = "; or real, the photo" if str(e).startswith("unknown decode mode") else ""
                raise StudyError(f"condition {spec!r}: {e}{photo}") from None
            if not 1 <= opts.k <= 16:
                raise StudyError(f"condition {spec!r}: k={opts.k} is outside 1..16")
            w = ref.strip() or (frozen if opts.mode == "greedy" else finetuned)
            label = weights_label(w)
            if refs.get(label, w) != w:
                raise StudyError(f"two different weights are both labelled {label!r}: {refs[label]} and {w}")
            refs[label] = w
            conds.append(Condition(opts.spec, label))
    names = [c.name for c in conds]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise StudyError(f"condition listed twice: {', '.join(dup)}")
    if not conds:
        raise StudyError("no conditions given")
    return conds, refs


def sample_seeds(study_seed: int, name: str, n: int) -> list[int]:
    """decode's sampling seed for each of a sampled condition's n faces: from the study seed, the
    condition's name and the face, so every condition draws its own, independent samples (two
    samplers with the same distribution compared on shared noise would not be a fair 50% test)."""
    return [int.from_bytes(hashlib.sha256(f"{study_seed}:{name}:{j}".encode()).digest()[:8], "little") >> 1
            for j in range(n)]


def parse_comparisons(compare, conds: list[Condition], frozen=FROZEN, finetuned=FINETUNED) -> list[tuple[str, str]]:
    """compare: "baseline" (every condition against the first; the real photo against it too),
    "all" (every pair), or a list of "A vs B" (preference is reported for A)."""
    names = [c.name for c in conds]
    model = [c.name for c in conds if c.decoded]
    if compare in (None, "baseline", ["baseline"]):
        if not model:
            raise StudyError("the study needs at least one decoded condition")
        base = model[0]
        pairs = [(n, base) for n in model[1:]]
        if "real" in names:
            pairs.append((base, "real"))  # preference for the model output = raters fooled
    elif compare in ("all", ["all"]):
        pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
        pairs = [(b, a) if a == "real" else (a, b) for a, b in pairs]
    else:
        pairs = []
        for item in ([compare] if isinstance(compare, str) else compare):
            parts = item.split(" vs ")
            if len(parts) != 2:
                raise StudyError(f"comparison {item!r}: write it as 'A vs B'")
            side = []
            for spec in parts:
                (c,), _ = parse_conditions([spec], frozen, finetuned)
                if c.name not in names:
                    raise StudyError(f"comparison {item!r}: {c.name} is not one of the conditions ({', '.join(names)})")
                side.append(c.name)
            pairs.append(tuple(side))
    seen = set()
    for a, b in pairs:
        if a == b:
            raise StudyError(f"comparison of {a} with itself")
        if frozenset((a, b)) in seen:
            raise StudyError(f"comparison {a} vs {b} listed twice")
        seen.add(frozenset((a, b)))
    if not pairs:
        raise StudyError("no comparisons: give at least two conditions")
    return pairs


# ---------------------------------------------------------------- images

def broken_image(img32: np.ndarray, seed: int) -> np.ndarray:
    """An obviously broken face for attention checks: 4x4 tiles shuffled, colours inverted."""
    rng = np.random.default_rng(seed)
    tiles = img32.reshape(8, 4, 8, 4, 3).transpose(0, 2, 1, 3, 4).reshape(64, 4, 4, 3)
    tiles = tiles[rng.permutation(64)]
    return 255 - tiles.reshape(8, 8, 4, 4, 3).transpose(0, 2, 1, 3, 4).reshape(32, 32, 3)


def png_bytes(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.asarray(img, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a killed build leaves no half-written image


def read_png(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def data_uri(img: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(img)).decode()


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_")


# ---------------------------------------------------------------- build

def build_study(folder, conditions=None, compare="baseline", data=None, split="test", n_faces=100,
                n_practice=3, seed=0, question=DEFAULT_QUESTION, frozen=FROZEN, finetuned=FINETUNED,
                batch_size=16, threads=0, progress=True, log=print) -> dict:
    """Make (or finish) a study folder; returns the manifest. Resumable: images already written
    are kept, so a killed build continues where it stopped. A folder holding a different study
    is refused."""
    import torch
    from tqdm import tqdm

    from .checkpoints import load_model, read_card, resolve, sha256_of
    from .data import downsample_8, load_faces
    from .decoding import decode

    folder = Path(folder)
    conds, refs = parse_conditions(conditions or DEFAULT_CONDITIONS, frozen, finetuned)
    comparisons = parse_comparisons(compare, conds, frozen, finetuned)
    if n_faces < 1 or n_practice < 0:
        raise StudyError(f"need at least one face (got n_faces={n_faces}, n_practice={n_practice})")
    if not question.strip():
        raise StudyError("the question is empty")
    weights, paths = {}, {}
    for label, ref in refs.items():
        p = resolve(ref)
        paths[label] = p
        card = None if p.suffix == ".pt" else read_card(p)
        weights[label] = {"sha256": sha256_of(p) if card is None else card["sha256"]}
        K = (card or {}).get("config", {}).get("n_blockwise")
        for c in conds:  # refuse now rather than after hours of decoding
            if c.weights == label and K is not None and c.k > K:
                raise StudyError(f"{c.name}: weights {label} have {K} blockwise heads, so k must be <= {K}")

    faces = load_faces(data).part(split)
    need = n_faces + n_practice
    if len(faces) < need:
        raise StudyError(f"split {split!r} has {len(faces)} faces; the study needs {need} "
                         f"({n_faces} rated + {n_practice} practice)")
    pick = np.sort(np.random.default_rng(seed).choice(len(faces), need, replace=False))
    images = faces.images[pick]

    dirs = {"real": "images/real", "broken": "images/broken"}
    for i, c in enumerate(conds):
        if c.decoded:
            dirs[c.name] = f"images/c{i:02d}_{_slug(c.name)}"
    # sampled conditions: decode's seed for every face, so that the images can be rebuilt bit for bit
    seeds = {c.name: sample_seeds(seed, c.name, need) for c in conds if c.rule == "sample"}

    def described(c: Condition) -> dict:
        # prior_weight only where it is not 1, guard where there is one and the sampling fields
        # only for samples: a study without them has the same manifest and id whichever version
        # built it
        return ({"name": c.name, "rule": c.rule, "k": c.k, "eps": c.eps, "weights": c.weights, "dir": dirs[c.name]}
                | ({"prior_weight": c.prior_weight} if c.prior_weight != 1 else {})
                | ({"guard": c.guard} if c.guard else {})
                | ({"temperature": c.temperature, "seeds": seeds[c.name]} if c.name in seeds else {}))

    settings = {
        "conditions": [described(c) for c in conds],
        "comparisons": [list(p) for p in comparisons],
        "weights": weights,
        "question": question.strip(),
        "seed": int(seed), "split": split, "n_faces": int(n_faces), "n_practice": int(n_practice),
        "faces": [{"index": j, "input_id": int(faces.ids[i]), "practice": j >= n_faces}
                  for j, i in enumerate(pick)],
    }
    mpath = folder / "manifest.json"
    restoring, damaged = None, set()  # a complete study with images missing or altered: made again
    if mpath.exists():
        old = _read_manifest(folder)
        if old.get("settings") != settings:
            diff = [k for k in settings if old.get("settings", {}).get(k) != settings[k]]
            raise StudyError(f"{folder} already holds a different study (differs in: {', '.join(diff)}); "
                             f"use a new folder")
        restoring = old if old.get("complete") else None
        if restoring:
            damaged = set(damaged_files(folder, restoring.get("files", {})))
            if not damaged:
                log(f"study {old['study_id']} in {folder} is already complete")
                return old
            # every image is made the same way again (decoding is deterministic; samples have
            # their seeds in the manifest): the damaged ones are made and written where they
            # come out as recorded; the others are left as they are
            log(f"study {old['study_id']}: {len(damaged)} image(s) missing or altered; making them again")
    folder.mkdir(parents=True, exist_ok=True)
    source = {"data": str(data or "default"), "weights": {k: str(v) for k, v in paths.items()}}
    if not restoring:  # a restore keeps the complete manifest: an interrupted one can be run again
        _write_json(mpath, {"format": FORMAT, "complete": False, "settings": settings, "source": source,
                            "built_with": app_version(), "started": now_iso()})
    differ = []  # restoring: images that came out otherwise than recorded (not written)

    def needed(rel: str) -> bool:
        return rel in damaged if restoring else not (folder / rel).exists()

    def put(rel: str, img: np.ndarray) -> bool:
        """Write a study image; restoring, only a damaged one, and only as recorded."""
        encoded = png_bytes(img)
        if restoring and (rel not in damaged or sha256_bytes(encoded) != restoring["files"].get(rel)):
            if rel in damaged:
                differ.append(rel)
            return False
        write_file(folder / rel, encoded)
        return True

    for j in range(need):  # photos and attention-check images need no model
        put(f"{dirs['real']}/{j:04d}.png", images[j])
        put(f"{dirs['broken']}/{j:04d}.png", broken_image(images[j], seed * 7919 + j))

    todo = [(c, [j for j in range(need) if needed(f"{dirs[c.name]}/{j:04d}.png")]) for c in conds if c.decoded]
    if threads:
        torch.set_num_threads(threads)
    models = {}
    bar = tqdm(total=sum(len(t) for _, t in todo), desc="decoding study", unit="img", disable=not progress)
    for c, missing in todo:
        stats_path = folder / dirs[c.name] / "stats.json"
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
        for s in range(0, len(missing), batch_size):
            idx = missing[s:s + batch_size]
            if c.weights not in models:
                models[c.weights] = load_model(paths[c.weights])
            bar.set_postfix_str(c.name)
            res = decode(models[c.weights], downsample_8(images[idx]), c.options(),
                         seeds=[seeds[c.name][j] for j in idx] if c.name in seeds else None)
            for j, img, st in zip(idx, res.images, res.stats):
                if put(f"{dirs[c.name]}/{j:04d}.png", img):
                    stats[str(j)] = {"mean_block": st.mean_block, "calls": st.calls}
            _write_json(stats_path, stats)
            bar.update(len(idx))
    bar.close()
    if restoring:
        if differ:  # e.g. other faces under --data, or decoded on a processor that rounds differently
            built = restoring.get("source", {}).get("data")
            raise StudyError(
                f"{folder}: {len(differ)} image(s) made again differ from the study's "
                f"({', '.join(sorted(differ)[:3])}{', ...' if len(differ) > 3 else ''}): not written"
                + (f"; the study was built from {built}, this run reads {source['data']}"
                   if built and built != source["data"] else "")
                + "; where they cannot be made as recorded, build the study in a new folder")
        log(f"study {restoring['study_id']} in {folder}: restored, complete")
        return restoring

    files = {}
    for d in sorted(set(dirs.values())):
        for j in range(need):
            rel = f"{d}/{j:04d}.png"
            files[rel] = sha256_bytes((folder / rel).read_bytes())
    decode_stats = {}
    for c in conds:
        sp = folder / dirs.get(c.name, "") / "stats.json"
        if c.decoded and sp.exists():
            st = json.loads(sp.read_text())
            vals = [st[str(j)]["mean_block"] for j in range(n_faces) if str(j) in st]
            decode_stats[c.name] = {"mean_block": float(np.mean(vals)) if vals else None}
    study_id = sha256_bytes(json.dumps({"settings": settings, "files": files}, sort_keys=True).encode())[:16]
    manifest = {"format": FORMAT, "complete": True, "study_id": study_id, "settings": settings,
                "files": files, "decode": decode_stats, "source": source, "built_with": app_version(),
                "finished": now_iso()}
    _write_json(mpath, manifest)
    log(f"study {study_id}: {len(conds)} conditions, {len(comparisons)} comparisons, "
        f"{n_faces} faces (+{n_practice} practice) in {folder}")
    return manifest


def damaged_files(folder: Path, files: dict[str, str]) -> list[str]:
    """The study images (relative path -> sha256) missing from `folder` or not as recorded."""
    return [rel for rel, sha in files.items()
            if not (folder / rel).is_file() or sha256_bytes((folder / rel).read_bytes()) != sha]


def _read_manifest(folder: Path) -> dict:
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
        m = _read_manifest(self.folder)
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


# ---------------------------------------------------------------- storage

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
MAX_RATER_ID = 64


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


# ---------------------------------------------------------------- rater sessions

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


# ---------------------------------------------------------------- analysis

def attention_summary(rows: list[dict], min_accuracy: float) -> dict:
    """rater -> {checks, correct, excluded}. A rater is excluded when the share of attention
    checks where they picked the real photo is below min_accuracy (raters with no check are kept)."""
    out = {}
    for r in rows:
        s = out.setdefault(r["rater"], {"checks": 0, "correct": 0, "excluded": False})
        if r["attention"]:
            s["checks"] += 1
            s["correct"] += r["chosen_cond"] == "real"
    for s in out.values():
        s["excluded"] = s["checks"] > 0 and s["correct"] / s["checks"] < min_accuracy
    return out


def exclusion_rule(min_accuracy: float) -> str:
    return (f"a rater is excluded when they picked the real photo in fewer than {min_accuracy:.0%} of "
            f"their attention checks (the real photo against an obviously broken image); raters "
            f"who answered no attention check are kept")


def bootstrap_ci(raters, images, y, n_boot: int = 2000, level: float = 0.90, seed: int = 0):
    """Percentile interval of a preference rate, resampling raters and images with replacement
    (two-way bootstrap: a judgment counts once per copy of its rater times copies of its image)."""
    y = np.asarray(y, float)
    if len(y) == 0:
        return float("nan"), float("nan")
    _, ri = np.unique(np.asarray(raters, dtype=object).astype(str), return_inverse=True)
    _, ii = np.unique(np.asarray(images), return_inverse=True)
    R, J = ri.max() + 1, ii.max() + 1
    rng = np.random.default_rng(seed)
    stats = []
    for s in range(0, n_boot, 250):  # chunks keep memory small
        b = min(250, n_boot - s)
        rc = rng.multinomial(R, np.full(R, 1 / R), size=b)
        ic = rng.multinomial(J, np.full(J, 1 / J), size=b)
        w = rc[:, ri] * ic[:, ii]
        tot = w.sum(1)
        ok = tot > 0
        stats.append((w[ok] @ y) / tot[ok])
    stats = np.concatenate(stats)
    a = (1 - level) / 2
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))


def analyze_judgments(rows: list[dict], comparisons, min_attention: float = 0.8, n_boot: int = 2000,
                      level: float = 0.90, seed: int = 0, identical=None) -> dict:
    """Per comparison (A, B): preference for A with a bootstrap interval, binomial test against
    50%, left-side choice rate, counts. identical(a, b, image) -> bool marks pixel-equal pairs."""
    from scipy.stats import binomtest

    att = attention_summary(rows, min_attention)
    kept = [r for r in rows if not r["attention"] and not att[r["rater"]]["excluded"]]
    out = []
    for a, b in comparisons:
        rs = [r for r in kept if {r["cond_a"], r["cond_b"]} == {a, b}]
        n = len(rs)
        y = [r["chosen_cond"] == a for r in rs]
        k = int(sum(y))
        lo, hi = bootstrap_ci([r["rater"] for r in rs], [r["image"] for r in rs], y, n_boot, level, seed)
        left = sum(r["chosen_side"] == "left" for r in rs)
        out.append({
            "a": a, "b": b, "n": n, "prefer_a": k,
            "rate": k / n if n else float("nan"), "ci": (lo, hi),
            "p_binomial": binomtest(k, n, 0.5).pvalue if n else float("nan"),
            "left_rate": left / n if n else float("nan"),
            "raters": len({r["rater"] for r in rs}), "images": len({r["image"] for r in rs}),
            "identical": (sum(identical(a, b, r["image"]) for r in rs) if identical and n else None),
        })
    left = sum(r["chosen_side"] == "left" for r in kept)
    checks = [r for r in rows if r["attention"]]
    return {
        "comparisons": out, "level": level, "n_boot": n_boot, "min_attention": min_attention,
        "rule": exclusion_rule(min_attention),
        "raters": {k: v for k, v in sorted(att.items())},
        "excluded": sorted(k for k, v in att.items() if v["excluded"]),
        "n_judgments": len(rows), "n_used": len(kept),
        "left": {"n": len(kept), "left": left, "rate": left / len(kept) if kept else float("nan"),
                 "p_binomial": binomtest(left, len(kept), 0.5).pvalue if kept else float("nan")},
        "attention": {"n": len(checks), "correct": sum(r["chosen_cond"] == "real" for r in checks)},
    }


def analyze(study: Study, db_path=None, **kw) -> dict:
    db = RatingDB(db_path or study.folder / "ratings.sqlite", study.study_id, create=False)
    res = analyze_judgments(db.judgments(), study.comparisons, identical=study.identical, **kw)
    res["study_id"] = study.study_id
    res["question"] = study.question
    res["weights"] = study.weights_sha
    res["decode"] = study.manifest.get("decode", {})
    refused = [r for r in db.refusals() if not r["practice"]]
    res["refused_quick"] = {"n": len(refused), "min_answer_ms": sorted({r["min_answer_ms"] for r in refused}),
                            "by_rater": dict(Counter(r["rater"] for r in refused).most_common())}
    return res


def _pct(x) -> str:
    return "—" if x is None or x != x else f"{100 * x:.1f}"


def _cell(c) -> str:
    if not c["n"]:
        return "no judgments"
    return f"{_pct(c['rate'])} [{_pct(c['ci'][0])}, {_pct(c['ci'][1])}] (n={c['n']})"


def table3(res: dict) -> str:
    """Table 3's layout: one row per k, columns exact / eps=E, the paper's number beside ours.
    Rows are comparisons of a k>1 condition (A) against k=1 greedy (B)."""
    cols, rows = {}, {}  # cols: column key -> the paper's numbers apply (neither side guided)
    for c in res["comparisons"]:
        pair = _conditions(c)
        if pair is None:
            continue
        a, b = pair
        if a.rule not in ("exact", "eps") or b.rule != "greedy":
            continue
        # guided or guarded conditions get their own columns, without the paper's numbers (it had
        # neither)
        guided = lambda c: ("" if c.prior_weight == 1 else f":w={c.prior_weight:g}") + \
            (f":guard={c.guard:g}" if c.guard else "")
        key = (a.mode + guided(a), a.weights, b.weights + guided(b))
        cols.setdefault(key, not guided(a) and not guided(b))
        rows.setdefault(a.k, {})[key] = c
    if not cols:
        return "(no comparison of a k>1 condition against greedy in this study)\n"
    several = len({(w1, w2) for _, w1, w2 in cols}) > 1
    head, line = ["k"], ["---"]
    for mode, wa, wb in cols:
        label = f"{mode} ({wa} vs {wb})" if several else mode
        head += [f"{label}: paper", f"{label}: ours [{res['level']:.0%} CI]"]
        line += ["---:", "---:"]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(line) + "|"]
    for k in sorted(rows):
        cells = [str(k)]
        for key in cols:
            paper = PAPER_TABLE3.get(key[0], {}).get(k) if cols[key] else None
            cells.append("—" if paper is None else f"{paper:.1f}")
            cells.append(_cell(rows[k][key]) if key in rows[k] else "—")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _conditions(c):
    try:
        return Condition.from_name(c["a"]), Condition.from_name(c["b"])
    except StudyError:
        return None


def fooled_table(res: dict) -> str:
    """% fooled: for each model output compared with the real photo, the share of judgments that
    picked the model's image, with its interval, beside the Image Transformer paper's ~36% (its
    study rated samples at temperature 0.8-1.0: the number is shown beside such rows only)."""
    out = [f"| model output | % fooled [{res['level']:.0%} CI] (judgments) | Image Transformer paper |",
           "|---|---:|---:|"]
    for c in res["comparisons"]:
        if "real" not in (c["a"], c["b"]) or not c["n"]:
            continue
        model = c["b"] if c["a"] == "real" else c["a"]
        rate, (lo, hi) = c["rate"], c["ci"]
        if c["a"] == "real":  # preference was for the photo: fooled is the other side
            rate, lo, hi = 1 - rate, 1 - hi, 1 - lo
        try:
            m = Condition.from_name(model)
            comparable = m.rule == "sample" and 0.8 <= m.temperature <= 1.0
        except StudyError:
            comparable = False
        paper = f"~{PAPER_FOOLED:.0f}" if comparable else "—"
        out.append(f"| {model} | {_pct(rate)} [{_pct(lo)}, {_pct(hi)}] ({c['n']}) | {paper} |")
    if len(out) == 2:
        if any("real" in (c["a"], c["b"]) for c in res["comparisons"]):
            return "(no judgments yet of a model output against the real photo)\n"
        return "(no comparison of a model output against the real photo in this study)\n"
    return "\n".join(out) + "\n"


def same_distribution(a: Condition, b: Condition) -> bool:
    """Two sampled conditions that differ only in k: speculative and plain sampling of the same
    model at the same temperature and guidance draw from the same distribution."""
    if a.rule != "sample" or b.rule != "sample" or a.weights != b.weights:
        return False
    oa, ob = a.options(), b.options()
    return (oa.temperature, oa.prior_weight, oa.guard) == (ob.temperature, ob.prior_weight, ob.guard)


def report_markdown(res: dict) -> str:
    pct_level = f"{res['level']:.0%}"
    n_raters = len(res["raters"])
    lines = [f"# Human rating study {res.get('study_id', '')}".rstrip(), ""]
    if res.get("question"):
        lines += [f"Question: \"{res['question']}\"", ""]
    lines += [f"{n_raters} raters ({len(res['excluded'])} excluded), {res['n_judgments']} judgments recorded, "
              f"{res['n_used']} used (attention checks and excluded raters left out).", "",
              f"Exclusion rule: {res['rule']}.", ""]
    if res["excluded"]:
        lines += ["Excluded raters: " + ", ".join(
            f"{r} ({res['raters'][r]['correct']}/{res['raters'][r]['checks']} checks passed)"
            for r in res["excluded"]), ""]
    at = res["attention"]
    lines += [f"Attention checks: {at['correct']} of {at['n']} picked the real photo"
              + (f" ({_pct(at['correct'] / at['n'])}%)." if at["n"] else "."), ""]
    lines += [f"## Table 3: preference (%) for the k>1 output over greedy (k=1), {pct_level} bootstrap CI", "",
              table3(res),
              "Paper: fine-tuned model with k>1 against the frozen k=1 (plain greedy) model; "
              "number of raters and pairs not reported.", ""]
    lines += ["## All comparisons", "",
              f"| A vs B | prefer A % | {pct_level} CI | p (binomial, 50%) | left chosen % | judgments "
              f"| raters | images | identical pairs |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in res["comparisons"]:
        ident = "—" if c["identical"] is None else str(c["identical"])
        p = "—" if c["p_binomial"] != c["p_binomial"] else f"{c['p_binomial']:.3g}"
        lines.append(f"| {c['a']} vs {c['b']} | {_pct(c['rate'])} | [{_pct(c['ci'][0])}, {_pct(c['ci'][1])}] "
                     f"| {p} | {_pct(c['left_rate'])} | {c['n']} | {c['raters']} | {c['images']} | {ident} |")
    lines += ["", f"## % fooled: model output against the real photo, {pct_level} bootstrap CI", "",
              fooled_table(res),
              f"Image Transformer paper: raters fooled about {PAPER_FOOLED:.0f}% of the time by its samples at "
              f"temperature 0.8-1.0 (its own model and raters); shown beside our samples at such temperatures only. "
              f"50% would mean raters cannot tell the model's faces from photos.", ""]
    checks = []
    for c in res["comparisons"]:
        pair = _conditions(c)
        if pair and same_distribution(*pair):
            p = "—" if c["p_binomial"] != c["p_binomial"] else f"{c['p_binomial']:.3g}"
            checks.append(f"- {c['a']} vs {c['b']}: {_cell(c)}, binomial p = {p}")
    if checks:
        lines += ["## Check of the method: samples of one distribution", "",
                  "These sampled conditions differ only in k (or their seed): speculative sampling (k > 1) "
                  "and plain sampling (k = 1) of the same model at the same temperature and guidance. "
                  "Their images differ (each face's "
                  "sample is drawn with its own seed), their distribution does not, so the expected "
                  "preference is 50%; an interval that excludes 50% would point at a fault.", ""]
        lines += checks + [""]
    rq = res.get("refused_quick")
    if rq and rq["n"]:
        lines += [f"Presses refused as too quick (under {'/'.join(map(str, rq['min_answer_ms']))} ms after their "
                  f"pair appeared; not judgments): {rq['n']}, by rater: "
                  + ", ".join(f"{r} {n}" for r, n in list(rq["by_rater"].items())[:10])
                  + (", ..." if len(rq["by_rater"]) > 10 else "") + ". Many from one rater suggest they "
                  "answered without looking.", ""]
    lf = res["left"]
    p = "—" if lf["p_binomial"] != lf["p_binomial"] else f"{lf['p_binomial']:.3g}"
    lines += ["", f"Left-side bias: the left image was chosen in {_pct(lf['rate'])}% of {lf['n']} "
              f"judgments (two-sided binomial p = {p}).", ""]
    if res.get("decode"):
        lines += ["Mean accepted block size of the study images: " + ", ".join(
            f"{k} {v['mean_block']:.2f}" for k, v in res["decode"].items() if v.get("mean_block")) + ".", ""]
    lines += [f"Method: preference = share of judgments choosing A. The {pct_level} interval is a percentile "
              f"bootstrap ({res['n_boot']} resamples) that resamples raters and images with replacement; the "
              f"binomial test treats judgments as independent. Identical pairs: both images equal pixel "
              f"for pixel (raters can only guess).", ""]
    return "\n".join(lines)


def write_csv(rows: list[dict], path, excluded=()) -> Path:
    """All judgments, one per line, with a column saying whether the rater was excluded."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(JUDGMENT_COLUMNS + ["rater_excluded"])
        for r in rows:
            w.writerow([r[c] for c in JUDGMENT_COLUMNS] + [int(r["rater"] in excluded)])
    os.replace(tmp, path)
    return path
