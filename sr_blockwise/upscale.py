"""Batch upscaling: folders, files and globs of faces in, 32x32 results out.

The pipeline per image is the Python API's (api.Upscaler), the demo's too: the photo is read
(data.open_rgb; large photos at reduced size), its faces found and aligned to the training
framing (sr_blockwise.faces; --faces largest or all; 8x8 and 32x32 images are used as they are,
--faces none takes the centre square or CelebA's crop), each 32x32 crop area-downsampled to 8x8
-> blockwise decoding -> 32x32, and with --paste-back the whole photo with the results pasted
back, at the scale the model works at (faces.paste_plan). Images are decoded together in batches, in every
mode; the decoder keeps each image's own position and accepted length (and, sampling, its own
seed), so an image's output does not depend on its batch.

Safety rules, each enforced below:
- outputs are written to a hidden temporary file in the target folder and renamed into place, so
  an interrupted run never leaves a half-written image (and --skip-existing can trust what exists);
- no output path may be an input (or ground-truth) file: such runs are refused before any work;
- a file that cannot be read is recorded with its reason and the run goes on;
- the first Ctrl-C (or SIGTERM) finishes the current batch and stops with a summary; a second
  one stops at once (the unfinished batch is simply not written).
"""
from __future__ import annotations

import contextlib
import csv
import glob
import hashlib
import json
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from .api import DEFAULT_DTYPE
from .data import IMAGE_EXTS, BadImage, bicubic_upscale, enlarge, image_to_input, match_input, open_rgb, read_input
from .faces import WHICH as FACES  # --faces: largest, all, none
from .metrics import PSNR_SETTINGS, SSIM_SETTINGS, psnr, ssim

SAVE_ARGS = {  # lossless or near-lossless: at 32x32 every pixel counts
    "png": ("PNG", {}),
    "jpg": ("JPEG", {"quality": 95, "subsampling": 0}),  # 4:4:4, no chroma blur
    "webp": ("WEBP", {"lossless": True}),
}
METRIC_FIELDS = ["input", "output", "relative", "status", "reason", "mode", "k", "eps", "temperature", "seed",
                 "batch_size", "prior_weight", "guard", "match_input", "calls", "mean_block", "seconds", "ground_truth", "psnr", "ssim",
                 "psnr_bicubic", "ssim_bicubic", "face", "framing", "box", "faces_note", "paste_scale"]
NO_FACE = ("centre", "skip")  # --no-face: a photo without a face found
# Pillow registers some formats it can only identify, not decode (or that need ghostscript)
_NOT_DECODABLE = {".bufr", ".grib", ".h5", ".hdf", ".mpeg", ".mpg", ".eps", ".ps", ".wmf", ".emf"}


def readable_exts() -> set[str]:
    """File extensions a folder scan picks up: everything Pillow can open."""
    Image.init()
    pil = {e for e, fmt in Image.registered_extensions().items() if fmt in Image.OPEN}
    return (pil - _NOT_DECODABLE) | IMAGE_EXTS


@dataclass
class Job:
    src: Path  # the input file, as found
    rel: PurePosixPath  # its path relative to the common base of the inputs (mirrored in OUTDIR)
    out: Path
    compare: Path | None = None
    gt: Path | None = None
    paste: Path | None = None  # --paste-back: the photo with its faces pasted back (faces.paste_plan)


@dataclass
class Config:
    inputs: list[str]
    outdir: str
    mode: str = "exact"
    k: int | None = None  # None: the mode's decoding.DEFAULT_K (2 for exact, 4 for approx and sample)
    eps: int | None = None  # approx only; None: 2
    temperature: float | None = None  # sample only; None: 1.0
    seed: int | None = None  # sample mode only (None: 0)
    weights: str | None = None
    batch_size: int = 16
    device: str = "auto"
    dtype: str = DEFAULT_DTYPE
    threads: int = 0
    ext: str = "png"
    suffix: str = ""
    skip_existing: bool = False
    compare: bool = False
    metrics: str | None = None
    ground_truth: str | None = None
    shard: str | None = None  # "I/N" or "auto" (torchrun's RANK/WORLD_SIZE)
    measure_greedy: bool = False
    match_input: bool = True  # back-project each output onto its 8x8 input (data.match_input)
    # input guidance (decoding.DecodeOptions.prior_weight); None: decoding.default_prior_weight
    # (DEFAULT_PRIOR_WEIGHT, or 1 for weights without the learned input prior)
    prior_weight: float | None = None
    # the cell guard's tolerance in levels (decoding.cell_guard); None: decoding.default_guard
    # (DEFAULT_GUARD, none for sample mode); 0: off
    guard: float | None = None
    faces: str = "largest"  # FACES
    no_face: str = "centre"  # NO_FACE
    paste_back: bool = False
    dry_run: bool = False
    quiet: bool = False


# ---------------------------------------------------------------- finding the inputs

def _resolve(p: Path) -> Path:
    """p.resolve(), or its absolute path where a symlink loop makes that fail: such a file is
    then reported as unreadable when it is opened, instead of stopping the planning."""
    try:
        return p.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(p))


def _glob_root(pattern: str) -> Path:
    """The folder part of a glob before its first wildcard: outputs mirror the tree below it."""
    parts = []
    for part in Path(pattern).parts:
        if glob.has_magic(part):
            break
        parts.append(part)
    return Path(*parts) if parts else Path(".")


def _glob(spec: str) -> list[Path]:
    """glob.glob(spec, recursive=True), sorted, except that a ** component does not descend into
    folder symlinks: glob's does, loops included (a loop lists every file below it dozens of
    times over, two crossing links exponentially many). Each ** is expanded by os.walk without
    following links, hidden folders left out as glob leaves them out; the rest of the pattern is
    glob's, so one wildcard still matches through a linked folder."""
    return sorted(Path(m) for m in set(_glob_paths(spec)))


def _glob_paths(spec: str) -> list[str]:
    parts = spec.split("/")
    if "**" not in parts:
        return glob.glob(spec, recursive=True)
    i = parts.index("**")
    head, tail = "/".join(parts[:i]), parts[i + 1:]
    if i == 1 and parts[0] == "":
        head = "/"  # /**/...
    bases = (glob.glob(head, recursive=True) if glob.has_magic(head) else [head]) if head else [""]
    out = []
    for base in bases:
        if base and not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base or ".", followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            here = dirpath if base else os.path.relpath(dirpath)
            prefix = "" if here == "." else here
            if tail in ([], [""]):  # a trailing ** (folders and files below) or **/ (folders)
                out.extend([prefix + "/"] if prefix else [])
                if not tail:
                    out.extend(os.path.join(prefix, f) for f in filenames if not f.startswith("."))
            else:
                rest = "/".join(tail)
                out.extend(_glob_paths(os.path.join(glob.escape(prefix), rest) if prefix else rest))
    return out


def _scan(folder: Path, exts: set[str], exclude: Path | None, ignored: list[Path]) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(folder):  # does not follow folder symlinks: no cycles
        dirnames.sort()
        if exclude is not None:  # an OUTDIR inside the input folder is not an input
            dirnames[:] = [d for d in dirnames if _resolve(Path(dirpath) / d) != exclude]
        for name in sorted(filenames):
            p = Path(dirpath) / name
            (files if p.suffix.lower() in exts else ignored).append(p)
    return files


def find_inputs(inputs: list[str], outdir: Path) -> tuple[list[tuple[Path, Path]], list[Path], list[Path]]:
    """Expand files, folders and glob patterns. Returns ([(file, root)], scanned folders, ignored
    files). Files named explicitly are always tried; folder and glob matches need an image
    extension (the others are listed as ignored)."""
    exts, out_res = readable_exts(), _resolve(outdir)
    found, folders, ignored = [], [], []

    def add_folder(d: Path, root: Path):
        if _resolve(d) == out_res:
            raise ValueError(f"OUTDIR {outdir} is the input folder {d}: results would mix with the "
                             "inputs; choose another folder")
        folders.append(d)
        found.extend((f, root) for f in _scan(d, exts, out_res, ignored))

    for spec in inputs:
        p = Path(spec)
        if p.is_file():
            found.append((p, p.parent))
        elif p.is_dir():
            add_folder(p, p)
        elif glob.has_magic(spec):
            matches = _glob(spec)
            if not matches:
                raise ValueError(f"no files match {spec!r}")
            root = _glob_root(spec)
            if _resolve(root) == out_res:
                raise ValueError(f"OUTDIR {outdir} is the folder of the pattern {spec!r}: results would mix "
                                 "with the inputs; choose another folder")
            for m in matches:
                if _resolve(m) == out_res or out_res in _resolve(m).parents:
                    continue  # OUTDIR or an earlier result, matched by a broad pattern
                if m.is_dir():
                    add_folder(m, root)
                elif m.suffix.lower() in exts:
                    found.append((m, root))
                else:
                    ignored.append(m)
        else:
            raise FileNotFoundError(f"no such file or folder: {spec}")
    return found, folders, ignored


def already_done(j: Job) -> bool:
    """What --skip-existing leaves: a job whose output, compare strip and pasted photo (those it
    makes) all exist."""
    return j.out.is_file() and (j.compare is None or j.compare.is_file()) and (j.paste is None or j.paste.is_file())


def parse_shard(spec: str | None) -> tuple[int, int]:
    """'I/N' -> (I, N); 'auto' reads torchrun's RANK and WORLD_SIZE; None -> (0, 1)."""
    if spec is None:
        return 0, 1
    if spec == "auto":
        spec = f"{os.environ.get('RANK', 0)}/{os.environ.get('WORLD_SIZE', 1)}"
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard {spec!r}: expected I/N, e.g. 0/4, or auto") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"--shard {spec}: need 0 <= I < N")
    return i, n


def shard_of(rel: PurePosixPath, n: int) -> int:
    """Which of n shards processes this input. It depends on the relative path alone (not on the
    other files), so every process agrees even if they list the inputs at different moments."""
    # fsencode: a file name that is not valid UTF-8 has bytes too (and valid ones the same bytes)
    return int.from_bytes(hashlib.sha1(os.fsencode(str(rel))).digest()[:8], "big") % n


def _gt_index(gt_dir: Path) -> dict[tuple[str, str], list[Path]]:
    """(relative folder, stem) -> ground-truth files, for matching by relative path and stem."""
    index = {}
    for f in _scan(gt_dir, readable_exts(), None, []):
        rel = PurePosixPath(f.relative_to(gt_dir).as_posix())
        index.setdefault((str(rel.parent), rel.stem), []).append(f)
    return index


def plan(cfg: Config) -> tuple[list[Job], list[Path], dict]:
    """All jobs of this shard, sorted by relative path; raises ValueError for bad arguments."""
    outdir = Path(cfg.outdir)
    if outdir.exists() and not outdir.is_dir():
        raise ValueError(f"OUTDIR {outdir} exists and is not a folder")
    if cfg.ext not in SAVE_ARGS:
        raise ValueError(f"--ext {cfg.ext!r}: choose from {sorted(SAVE_ARGS)}")
    if any(c in cfg.suffix for c in "/\\"):
        raise ValueError(f"--suffix {cfg.suffix!r} must not contain a path separator")
    if cfg.faces not in FACES:
        raise ValueError(f"--faces {cfg.faces!r}: choose from {', '.join(FACES)}")
    if cfg.no_face not in NO_FACE:
        raise ValueError(f"--no-face {cfg.no_face!r}: choose from {', '.join(NO_FACE)}")
    found, folders, ignored = find_inputs(cfg.inputs, outdir)

    # mirror the tree below the common folder of all inputs
    base = Path(os.path.commonpath([os.path.abspath(r) for _, r in found])) if found else Path(".")
    jobs, seen = {}, set()
    for f, _ in found:
        # the same path via two inputs: decode it once. Not by resolved path: a symlink (alias.png
        # -> real.png) is an input file of its own name, and gets its own output
        key = os.path.abspath(f)
        if key in seen:
            continue
        seen.add(key)
        rel = PurePosixPath(Path(os.path.abspath(f)).relative_to(base).as_posix())
        jobs[rel] = Job(f, rel, Path())
    ordered = [jobs[r] for r in sorted(jobs)]

    # output names: STEM+SUFFIX.EXT in the mirrored folder; photo.jpg and photo.png side by side
    # would collide, so those keep their input extension in the name (photo_jpg.png)
    # (with --faces all: STEM_face0+SUFFIX.EXT, the further faces STEM_face1..., see face_output)
    def name(j: Job, with_ext: bool, part: str = "") -> Path:
        stem = j.rel.stem + (f"_{j.rel.suffix.lstrip('.').lower()}" if with_ext else "")
        return outdir.joinpath(*j.rel.parent.parts, f"{stem}{part}{cfg.suffix}.{cfg.ext}")

    counts = {}
    for j in ordered:
        counts[name(j, False)] = counts.get(name(j, False), 0) + 1
    for j in ordered:
        with_ext = counts[name(j, False)] > 1
        j.out = name(j, with_ext, "_face0" if cfg.faces == "all" else "")
        if cfg.compare:
            j.compare = j.out.with_name(f"{j.out.stem}_compare.{cfg.ext}")
        if cfg.paste_back:  # NAME{SUFFIX}_pasted, as the compare strip: the suffix ends the output's name
            whole = name(j, with_ext)
            j.paste = whole.with_name(f"{whole.stem}_pasted.{cfg.ext}")
    outs = {}
    for j in ordered:
        for o in (j.out, j.compare, j.paste):
            if o is not None and outs.setdefault(o, j) is not j:
                raise ValueError(f"{j.src} and {outs[o].src} would both be written to {o}; "
                                 "rename one or run them separately")

    if cfg.ground_truth:
        gt_dir = Path(cfg.ground_truth)
        if not gt_dir.is_dir():
            raise FileNotFoundError(f"--ground-truth {gt_dir}: no such folder")
        index = _gt_index(gt_dir)
        for j in ordered:
            cands = index.get((str(j.rel.parent), j.rel.stem), [])
            exact = [c for c in cands if c.name == j.rel.name]
            j.gt = (exact or cands or [None])[0]

    # inputs are never overwritten: refuse before any work
    protected = {_resolve(j.src) for j in ordered} | {_resolve(j.gt) for j in ordered if j.gt}
    for o, j in outs.items():
        if _resolve(o) in protected:
            raise ValueError(f"OUTDIR {outdir} would overwrite {o}, which is an input; "
                             "choose another OUTDIR (or --suffix / --ext)")
    # nor are other files beside them: in a folder that holds inputs (photos/*.jpg -o photos), a
    # result would replace a photo there that has its name (group1.png), unless --skip-existing
    # leaves the whole job (all its outputs there)
    input_folders = {_resolve(j.src.parent) for j in ordered}
    for j in ordered:
        if cfg.skip_existing and already_done(j):
            continue
        for o in (j.out, j.compare, j.paste):
            if o is not None and foreign_beside_inputs(o, input_folders):
                raise ValueError(f"{_shown(o)} {FOREIGN}: choose another OUTDIR, or --suffix / --ext, or "
                                 "--skip-existing to leave the input and its outputs alone")

    i, n = parse_shard(cfg.shard)
    mine = [j for j in ordered if shard_of(j.rel, n) == i]
    out_res = _resolve(outdir)
    info = {"base": base, "folders": folders, "ignored": ignored, "total": len(ordered), "shard": (i, n),
            "protected": protected, "input_folders": input_folders,
            # an OUTDIR inside an input folder is not searched for inputs: the first line says so
            "outdir_inside": any(_resolve(d) in out_res.parents for d in folders)}
    return mine, ignored, info


# ---------------------------------------------------------------- single images

@dataclass
class Photo:
    """An input file's faces, as the batch command decodes them."""
    image: Image.Image | None  # the photo as read (None for 8x8 and 32x32 inputs: used as they are)
    faces: list  # faces.Face, largest first; for an 8x8 / 32x32 input, one (lr, face-or-None) pair
    note: str  # what was found, e.g. "2 faces found" or "no face found ...: its centre square is used"
    warn: bool = False  # no face found: said on the terminal


def load_photo(path: Path, which: str = "largest", no_face: str = "centre") -> Photo:
    """A file -> its faces (sr_blockwise.faces.faces_of): 8x8 and 32x32 images as they are;
    --faces none the centre square (CelebA's crop for 178x218)."""
    img = open_rgb(path)
    if img.size in ((8, 8), (32, 32)):
        lr, face = image_to_input(img)
        return Photo(None, [(lr, face)], "as is")
    from . import faces as F
    found, note = F.faces_of(img, which, if_none=no_face)
    # a warning where no face was found (--faces none asked for the centre square)
    return Photo(img, found, note, warn=which != "none" and (not found or found[0].how == "centre square"))


def paste_plan_of(ph: Photo):
    """The scale a photo's faces are pasted back at (faces.paste_plan: the model's, where a face is
    larger than the 32x32 output) and the faces pasted; (None, []) for an 8x8 / 32x32 input, whose
    result is the whole photo. A photo where no face was found is pasted nothing: the centre square
    that stood in for its face file is no face of the photo."""
    if ph.image is None:
        return None, []
    from .faces import paste_plan
    pasted = [] if ph.warn else ph.faces
    return paste_plan(ph.image.size, pasted, own_size=ph.image.info.get("full_size")), pasted


def load_ground_truth(path: Path, face=None, input_size: tuple[int, int] | None = None) -> np.ndarray:
    """A real face of any size -> 32x32 through the same crop as the inputs: for a face of a photo
    (faces.Face), the ground truth is taken as the same photo at its own size and cropped as the
    face was (faces.crop_like)."""
    if face is None or input_size is None:
        _, real = read_input(path)
        if real is None:
            raise BadImage(f"{path}: an 8x8 image cannot be a 32x32 ground truth")
        return real
    from . import faces as F
    return F.crop_like(open_rgb(path), face, input_size)


def check_writable(folder: Path, what: str) -> None:
    """ValueError (a bad argument: exit 2, before any work) unless `folder` takes files, or can be
    made in a folder that does. Makes no folder: a probe file in the nearest existing one is
    written and removed."""
    there = folder
    while not os.path.lexists(there) and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise ValueError(f"{what} {folder}: cannot be made ({there} is not a folder)")
    probe = _temp_name(there / "write-test")
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{what} {folder}: cannot be written to ({e.strerror or e})") from None


# a temporary file's name: this machine, the writing process, random (_temp_name)
_HOST = hashlib.sha1(socket.gethostname().encode(errors="surrogateescape")).hexdigest()[:8]
_TEMP = re.compile(r"\.([0-9a-f]{8})-([0-9]+)-[0-9a-f]{12}\.tmp")


def _temp_name(path: Path) -> Path:
    """A short hidden temporary name next to `path`: a long name plus a suffix could pass the file
    system's 255-byte limit. It names this machine and process (a later run removes what a killed
    one left: sweep_temp_files), and is random, so that processes on other machines sharing the
    folder (where process ids can be equal) never write the same file."""
    return path.with_name(f".{_HOST}-{os.getpid()}-{os.urandom(6).hex()}.tmp")


def _alive(pid: int) -> bool:
    if os.name == "nt":  # there os.kill ends the process whatever the signal: assume it lives
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):  # none with that id (or an id no process has)
        return False
    except PermissionError:  # another user's
        pass
    return True


TEMP_STALE_S = 600  # a temporary file untouched this long is no write in progress (one takes seconds)


def sweep_temp_files(folders, stale_s: float = TEMP_STALE_S) -> int:
    """Remove the temporary files that a process of this machine, killed while writing (SIGKILL,
    out of memory), left in these folders: named by this machine and a process that is gone, and
    untouched for stale_s seconds, so that a write in progress is never taken for one (containers
    may share a host name but not their process ids). Those of live processes and of other
    machines sharing a folder stay. Returns how many were removed."""
    removed, now = 0, time.time()
    for folder in folders:
        try:
            names = [f.name for f in Path(folder).iterdir()]
        except OSError:  # not there yet, or not readable: nothing of ours in it
            continue
        for name in names:
            m = _TEMP.fullmatch(name)
            if not (m and m.group(1) == _HOST and not _alive(int(m.group(2)))):
                continue
            path = Path(folder) / name
            try:
                if now - path.stat().st_mtime >= stale_s:
                    path.unlink()
                    removed += 1
            except OSError:
                pass
    return removed


SOFTWARE = "sr-blockwise"  # the EXIF Software tag of every file written: a later run knows its own results
_EXIF_SOFTWARE = 0x0131


def save_atomic(img: np.ndarray, path: Path, ext: str) -> None:
    """Write to a hidden temporary file next to `path`, then rename: readers (and a resumed run)
    only ever see complete images. The file is marked as this tool's (made_here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt, kw = SAVE_ARGS[ext]
    tmp = _temp_name(path)
    exif = Image.Exif()
    exif[_EXIF_SOFTWARE] = SOFTWARE
    with _written_as(tmp, path):
        Image.fromarray(img).save(tmp, format=fmt, exif=exif.tobytes(), **kw)
        os.replace(tmp, path)


@contextlib.contextmanager
def _written_as(tmp: Path, path: Path):
    """Around writing `path` as the temporary file `tmp`: where it fails, tmp is removed and an
    error about tmp names path (the user's file, not a hidden name)."""
    try:
        yield
    except BaseException as e:
        with contextlib.suppress(OSError):  # a read-only file system refuses even the unlink
            tmp.unlink()
        if isinstance(e, OSError) and e.errno is not None and e.filename in (str(tmp), tmp):
            raise OSError(e.errno, e.strerror, str(path)) from None  # OSError(errno, ...) is PermissionError etc.
        raise


def made_here(path: Path) -> bool:
    """Whether an image file is a result this tool wrote (save_atomic's mark), not a photo of the
    user's that happens to have a result's name."""
    try:
        with Image.open(path) as img:
            return img.getexif().get(_EXIF_SOFTWARE) == SOFTWARE
    except (OSError, SyntaxError, ValueError):
        return False


FOREIGN = "exists beside the inputs, was not written by sr-blockwise, and a result would replace it"


def foreign_beside_inputs(path: Path, input_folders: set) -> bool:
    """Whether writing a result to `path` would replace a file of the user's sitting among the
    inputs (a file this tool wrote there is its own to replace)."""
    return _resolve(path.parent) in input_folders and path.exists() and not made_here(path)


def compare_strip(lr: np.ndarray, out: np.ndarray, gt: np.ndarray | None = None, scale: int = 4) -> np.ndarray:
    """8x8 input (nearest), bicubic, output [, ground truth], 32 px each with a white gap,
    enlarged `scale` times so the pixels stay visible."""
    panels = [enlarge(lr, 4), bicubic_upscale(lr), out] + ([gt] if gt is not None else [])
    gap = np.full((32, 1, 3), 255, np.uint8)
    row = np.concatenate([x for p in panels for x in (p, gap)][:-1], axis=1)
    return enlarge(row, scale)


def quality(gt: np.ndarray, img: np.ndarray) -> tuple[float, float]:
    """(PSNR, SSIM) of one output against its ground truth, as `evaluate` computes them."""
    return float(psnr(gt, img)[0]), float(ssim(gt, img)[0])


def job_seed(seed: int, rel: PurePosixPath) -> int:
    """Sampling seed per image (decode's `seeds=`) from --seed and its relative path: the same
    image gets the same sample whatever its batch, shard or resume. (The factor 1_000_003 is the
    stride of decode's own per-image seeds: an image gets the sample decode gives it alone, as its
    image 0, at seed sha1(SEED:REL).)"""
    return int.from_bytes(hashlib.sha1(os.fsencode(f"{seed}:{rel}")).digest()[:4], "big") * 1_000_003


# ---------------------------------------------------------------- the run

def after_batch(summary: "Summary") -> None:
    """Called after each batch is written. A hook for tests (e.g. to simulate a Ctrl-C)."""


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
            from .model import SEQ_LEN  # greedy: one call per intensity (torch is loaded by now)
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


class _StopFlag:
    """First Ctrl-C / SIGTERM: finish the current batch, then stop. Second: stop now."""

    def __init__(self, quiet: bool):
        self.set, self.quiet, self.old = False, quiet, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # signals only work there
            for s in (signal.SIGINT, signal.SIGTERM):
                self.old[s] = signal.signal(s, self.handle)
        return self

    def handle(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set = True
        if not self.quiet:
            print("\nstopping after the current batch (a second Ctrl-C or SIGTERM stops now)", file=sys.stderr)

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)


def decode_batch(up, lrs: np.ndarray, jobs: list[Job], opts, progress=None):
    """(B,8,8,3) -> (the decoder's own images, api.ImageStats per image). Sampling seeds each
    image from its path (job_seed), not from its position in the batch, so a sample does not
    depend on its batch either."""
    seeds = [job_seed(opts.seed, j.rel) for j in jobs] if opts.temperature > 0 else None
    return up.decode(lrs, opts, seeds=seeds, progress=progress)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def run(cfg: Config) -> int:
    """The whole command; returns the exit code (0 all done, 1 some failed, 130 interrupted).
    Bad arguments raise ValueError / FileNotFoundError (exit 2 in the CLI)."""
    return BatchRun(cfg).run()


def validate(cfg: Config) -> None:
    """The arguments' own checks, before any file is looked at."""
    if cfg.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {cfg.batch_size}")
    if cfg.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0: torch's default), got {cfg.threads}")
    if cfg.mode == "greedy" and cfg.k not in (None, 1):
        raise ValueError(f"--k {cfg.k}: greedy decoding takes one token per call; --mode exact gives "
                         "the same output in blocks of up to --k")
    # flags another mode would ignore are refused, not dropped: the run would not be what was asked
    if cfg.eps is not None and cfg.mode != "approx":
        raise ValueError(f"--eps {cfg.eps}: only --mode approx accepts proposals within eps levels "
                         f"(--mode {cfg.mode} does not read it)")
    if cfg.temperature is not None and cfg.mode != "sample":
        raise ValueError(f"--temperature {cfg.temperature:g}: only --mode sample draws at a temperature "
                         f"(--mode {cfg.mode} does not read it)")
    if cfg.seed is not None and cfg.mode != "sample":
        raise ValueError(f"--seed {cfg.seed}: only --mode sample draws with a seed (--mode {cfg.mode} does not read it)")
    # the values, in the flags' own words (the decoder's checks would name its mode specs)
    if cfg.k is not None and cfg.k < 1:
        raise ValueError(f"--k {cfg.k}: the block size must be >= 1")
    if cfg.eps is not None and not 0 <= cfg.eps <= 255:
        raise ValueError(f"--eps {cfg.eps}: the tolerance must be in 0..255 intensity levels")
    if cfg.temperature is not None and not (math.isfinite(cfg.temperature) and cfg.temperature > 0):
        raise ValueError(f"--temperature {cfg.temperature:g}: must be a finite number above 0 "
                         "(0 would be greedy decoding: --mode greedy)")
    if cfg.seed is not None and not 0 <= cfg.seed < 2 ** 32:
        raise ValueError(f"--seed {cfg.seed}: must be a whole number in 0..{2 ** 32 - 1}")
    if cfg.guard is not None and not (math.isfinite(cfg.guard) and cfg.guard >= 0):
        raise ValueError(f"--guard {cfg.guard:g}: must be a number of intensity levels >= 0 (0: off)")
    if cfg.prior_weight is not None and not (math.isfinite(cfg.prior_weight) and cfg.prior_weight >= 0):
        raise ValueError(f"--prior-weight {cfg.prior_weight:g}: the input guidance must be a number >= 0 "
                         "(1: the model as trained)")


class BatchRun:
    """One run of the command, in stages: validate, plan, check (or list a dry run), open, then
    batches decoded and their photos written, then the summary. The stages share the run's
    attributes: the jobs, the model and options, the summary, the metrics, the progress bar."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.face_files = {}  # output folder -> {(name before _faceN, extension): [N >= 1, ...]}
        self.photos = {}  # id(job) -> (Photo, results so far): a photo's outputs wait for all its faces
        self.progress_shown = 0.0  # when the bar last showed the batch's share

    def run(self) -> int:
        validate(self.cfg)
        self.plan_work()
        self.check()
        if self.cfg.dry_run:
            return self.list_dry_run()
        self.open()
        self.warn_kept_unlike()
        self.decode_all()
        return self.summarise()

    def say(self, msg: str) -> None:
        # a message names paths: their control characters escaped, as everywhere (a message is one line)
        if not self.cfg.quiet:
            print(_shown(msg), file=sys.stderr)

    # ------------------------------------------------ plan and checks

    def plan_work(self) -> None:
        """This shard's jobs, those an earlier run did (--skip-existing), the rest to do; said."""
        cfg = self.cfg
        self.jobs, ignored, self.info = plan(cfg)
        if self.info["total"] == 0:
            raise ValueError("no images found in " + ", ".join(cfg.inputs)
                             + (f" ({_count(len(ignored), 'file')} without an image extension ignored)" if ignored else ""))
        self.mpath = metrics_path(cfg.metrics, self.info["shard"])
        self.done_before = [j for j in self.jobs if cfg.skip_existing and already_done(j)]
        self.skip = {id(j) for j in self.done_before}
        self.todo = [j for j in self.jobs if id(j) not in self.skip]
        shard_i, shard_n = self.info["shard"]
        self.say(f"{_count(self.info['total'], 'image')} under {self.info['base']}"
                 + (f", shard {shard_i}/{shard_n}: {len(self.jobs)}" if shard_n > 1 else "")
                 + (f", {len(self.done_before)} already done" if self.done_before else "")
                 + (f"; ignored {_count(len(ignored), 'file')} without an image extension (e.g. {ignored[0]})"
                    if ignored else "")
                 + (f"; OUTDIR {cfg.outdir}, inside an input folder, is not searched for inputs"
                    if self.info["outdir_inside"] else ""))
        no_gt = [j for j in self.todo if j.gt is None] if cfg.ground_truth else []
        if no_gt:
            self.say(f"warning: no ground truth in {cfg.ground_truth} for {len(no_gt)} of {len(self.todo)} inputs "
                     f"(e.g. {no_gt[0].src}): they get no PSNR / SSIM")

    def check(self) -> None:
        """Every check that needs no model, before a dry run lists the work: it refuses what the
        run would."""
        from .api import pick_device
        from .checkpoints import card_config, default_weights, resolve
        from .decoding import options_for

        cfg = self.cfg
        self.seed = 0 if cfg.seed is None else cfg.seed
        eps = 2 if cfg.eps is None else cfg.eps
        temperature = 1.0 if cfg.temperature is None else cfg.temperature
        options_for(cfg.mode, k=cfg.k, eps=eps, temperature=temperature, seed=self.seed)  # made again with the model
        if not cfg.dry_run:  # the machine's, not the arguments': a dry run may plan the work elsewhere
            pick_device(cfg.device)
        card = resolve(cfg.weights or default_weights())
        self.check_k(card_config(card)[1].n_blockwise if card.suffix == ".json" else None)  # a .pt's: once it loads
        # OUTDIR (where there is anything to write) and the metrics file's folder must take files
        if self.todo:
            check_writable(Path(cfg.outdir), "OUTDIR")
        if self.mpath:
            if Path(self.mpath).is_dir():
                raise ValueError(f"--metrics {self.mpath} is a folder; name a .csv or .json file")
            check_writable(Path(self.mpath).parent, "--metrics folder")

    def check_k(self, heads: int | None) -> None:
        """k beyond the model's heads: a bad argument, before any work."""
        k = self.cfg.k
        if k is not None and heads is not None and k > heads:
            raise ValueError(f"--k {k}: these weights have {heads} blockwise heads, so --k must be in 1..{heads}")

    def list_dry_run(self) -> int:
        cfg = self.cfg
        for j in self.jobs:
            # with --paste-back, the scale each photo would be pasted back at: its faces are found
            todo = id(j) not in self.skip
            scale = "\t" + _shown(dry_paste_plan(j.src, cfg.faces, cfg.no_face)) if cfg.paste_back and todo else ""
            print(f"{'todo' if todo else 'skip'}\t{_shown(j.src)}\t{_shown(j.out)}{scale}")
        return 0

    # ------------------------------------------------ open

    def open(self) -> None:
        """What a killed run left removed, the model loaded, the options settled against it, the
        summary and the metrics begun (with the rows of the outputs kept)."""
        import torch

        from .api import Upscaler
        from .decoding import not_native

        cfg = self.cfg
        # what a killed run left half-written in the folders this one writes to
        swept = sweep_temp_files(sorted({p.parent for j in self.jobs for p in (j.out, j.compare, j.paste) if p}
                                        | ({Path(self.mpath).parent} if self.mpath else set())))
        if swept:
            self.say(f"removed {_count(swept, 'temporary file')} that a killed run left")
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        t0 = time.perf_counter()
        self.up = up = Upscaler(cfg.weights, device=cfg.device, dtype=cfg.dtype)
        self.check_k(up.max_k)  # a training checkpoint's heads are known once it loads
        # the weights' default guidance where none is given, the mode checked against these weights
        self.opts = up.options(cfg.mode, k=cfg.k, eps=cfg.eps, temperature=cfg.temperature, seed=self.seed,
                               prior_weight=cfg.prior_weight, guard=cfg.guard)
        why = not_native(up.model)
        if self.todo and why and up.device == "cpu":  # on a GPU the PyTorch engine is the one meant
            print(f"warning: decoding on the PyTorch engine, many times slower than the native one: {why}",
                  file=sys.stderr)
        self.summary = Summary(total=len(self.jobs), skipped=len(self.done_before),
                               load_seconds=time.perf_counter() - t0)
        settings = self.settings()
        self.metrics = Metrics(self.mpath, settings, cfg.skip_existing, cfg.outdir)
        self.base_row = {k: settings[k] for k in ("mode", "k", "eps", "temperature", "seed", "batch_size",
                                                  "prior_weight", "guard", "match_input")}
        for j in self.done_before:
            self.metrics.add({**self.names(j), "status": "skipped"})
            # with --faces all, the photo's other faces written by the earlier run keep their rows too
            for f in (self.further_faces(j) if cfg.faces == "all" else []):
                out = self.face_output(j, f, j.out)
                self.metrics.add({**self.names(j), "output": str(out),
                                  "relative": out.relative_to(cfg.outdir).as_posix(), "status": "skipped"})

    def settings(self) -> dict:
        """The run's settings, as the metrics file records them."""
        cfg, opts = self.cfg, self.opts
        shard_i, shard_n = self.info["shard"]
        return {"weights": str(self.up.weights), "mode": cfg.mode, "k": opts.k,
                "eps": opts.eps if cfg.mode == "approx" else None,
                "temperature": opts.temperature or None, "seed": self.seed if opts.temperature else None,
                "batch_size": cfg.batch_size, "prior_weight": opts.prior_weight, "guard": opts.guard,
                "match_input": cfg.match_input, "device": self.up.device, "dtype": cfg.dtype,
                "shard": f"{shard_i}/{shard_n}", "ssim": dict(SSIM_SETTINGS), "psnr": dict(PSNR_SETTINGS)}

    def warn_kept_unlike(self) -> None:
        """A resumed run whose settings differ would leave its outputs unlike each other: say so,
        for each setting that outputs kept by --skip-existing were made with otherwise."""
        m, pw, guard = self.cfg.match_input, self.opts.prior_weight, self.opts.guard
        # (the setting, its value in an earlier row, its value now, how the kept ones were made,
        # what the new ones are, what to pass to keep them alike). A CSV row holds "True" /
        # "False", a JSON row a bool; a row of a run before the setting existed has none (or ""
        # in a CSV): not matched, decoded at weight 1, without the guard
        for key, read, now, kept, new, flag in [
                ("match_input", lambda v: str(v or False), str(m), f"saved {'without' if m else 'with'} --match-input",
                 f"are {'' if m else 'not '}matched", f"--{'no-' if m else ''}match-input"),
                ("prior_weight", lambda v: float(v or 1), pw, "decoded with another --prior-weight",
                 f"use {pw:g}", "the old --prior-weight"),
                ("guard", lambda v: float(v or 0), guard, "decoded with another --guard",
                 f"use {guard:g}", "the old --guard")]:
            rows = [self.metrics.previous.get(self.names(j)["relative"]) for j in self.done_before]
            unlike = [j for j, r in zip(self.done_before, rows) if r is not None and read(r.get(key)) != now]
            if unlike:
                print(f"warning: {len(unlike)} outputs kept by --skip-existing were {kept} "
                      f"(e.g. {_shown(unlike[0].out)}); the new ones {new}. Rerun those without "
                      f"--skip-existing, or pass {flag}, to keep them alike", file=sys.stderr)

    # ------------------------------------------------ names

    def names(self, j: Job) -> dict:
        """A metrics row's paths."""
        return {"input": str(j.src), "output": str(j.out), "relative": j.out.relative_to(self.cfg.outdir).as_posix()}

    def face_output(self, j: Job, n: int, path: Path) -> Path:
        """Face n's file: with --faces all, STEM_face0 -> STEM_faceN (likewise its _compare)."""
        if n == 0:
            return path
        head, mark, tail = path.name.rpartition(f"_face0{self.cfg.suffix}")  # the mark plan() added: the last
        return path.with_name(f"{head}_face{n}{self.cfg.suffix}{tail}")

    def further_faces(self, j: Job) -> list[int]:
        """With --faces all, the numbers n >= 1 of the photo's face files in OUTDIR (each folder
        listed once: a resume of a large run asks this of every photo)."""
        suffix, folder = self.cfg.suffix, j.out.parent
        if folder not in self.face_files:
            pattern = re.compile(r"(.*)_face([1-9][0-9]*)" + re.escape(suffix) + r"(\.[^.]*)")
            index = self.face_files[folder] = {}
            for f in (folder.iterdir() if folder.is_dir() else []):
                m = pattern.fullmatch(f.name)
                if m:
                    index.setdefault((m.group(1), m.group(3)), []).append(int(m.group(2)))
        head, _, tail = j.out.name.rpartition(f"_face0{suffix}")
        return sorted(self.face_files[folder].get((head, tail), []))

    # ------------------------------------------------ batches and decoding

    def decode_all(self) -> None:
        """Batch after batch until every job is done or a stop is asked for; the metrics written
        at the end whatever happens (after a crash, as of a run that broke off)."""
        from tqdm import tqdm

        cfg, s = self.cfg, self.summary
        shard_i, shard_n = self.info["shard"]
        self.bar = tqdm(total=len(self.todo), unit="img", disable=cfg.quiet, dynamic_ncols=True, smoothing=0.1,
                        desc="upscale" + (f" {shard_i}/{shard_n}" if shard_n > 1 else ""))
        t1 = time.perf_counter()
        ended = False  # the run came to its end, or to a stop asked for; not a crash
        try:
            with _StopFlag(cfg.quiet) as self.stop:
                for batch in self.batches():
                    if not self.decode(batch):
                        continue
                    s.seconds = time.perf_counter() - t1
                    self.metrics.maybe_write(s)
                    after_batch(s)
                    if self.stop.set and not self.photos:  # a photo begun is finished first: its faces are
                        break  # written together (batches() reads no further file)
                # Ctrl-C: stopped after the batch in hand (one whose decoding failed ends in batches())
                s.interrupted = self.stop.set
            ended = True
        except KeyboardInterrupt:  # the second Ctrl-C: the batch in flight is dropped
            s.interrupted = ended = True
        finally:
            s.seconds = time.perf_counter() - t1
            self.bar.close()
            try:
                self.metrics.write(s, finished=ended)  # not after a crash: the file then says the run broke off
                s.metrics_error = None
            except OSError as e:
                s.metrics_error = _shown(f"{self.mpath}: {e}")

    def batches(self):
        """(job, face number, 8x8 input) batches; a photo's faces may span several batches."""
        cfg, batch = self.cfg, []
        for j in self.todo:
            if self.stop.set:  # Ctrl-C: read no more (also when every file so far failed to load)
                break
            try:
                ph = load_photo(j.src, cfg.faces, cfg.no_face)
            except BadImage as e:  # its message starts with the file's name: we print the path
                self.fail(j, str(e).removeprefix(f"{j.src}: ").removeprefix(f"{j.src.name}: "))
                continue
            except Exception as e:  # whatever else a strange file does, the run goes on
                self.fail(j, f"{type(e).__name__}: {e}")
                continue
            if ph.warn:
                self.bar.write(f"warning: {_shown(j.src)}: {ph.note}"
                               + ("; the pasted photo is the photo enlarged, nothing pasted"
                                  if cfg.paste_back and ph.faces else ""), file=sys.stderr)
            if not ph.faces:  # --no-face skip
                self.summary.no_face.append(str(j.src))
                self.metrics.add({**self.names(j), "status": "no face", "reason": ph.note})
                self.bar.update(1)
                continue
            self.photos[id(j)] = (ph, {})
            for n, f in enumerate(ph.faces):
                if id(j) not in self.photos:  # a batch with its first faces failed: the rest would be dropped
                    break
                batch.append((j, n, f[0] if isinstance(f, tuple) else f.lr))
                if len(batch) == cfg.batch_size:
                    yield batch
                    batch = []
        if batch:
            yield batch

    def decode(self, batch) -> bool:
        """A batch decoded, and each photo whose faces are all decoded then written; False where
        the decoding failed (its photos reported failed, the run goes on)."""
        cfg, s, opts = self.cfg, self.summary, self.opts
        bjobs = [j for j, _, _ in batch]
        lrs = np.stack([lr for _, _, lr in batch])
        try:
            images, stats = decode_batch(self.up, lrs, bjobs, opts, None if cfg.quiet else self.progress)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # e.g. out of GPU memory: report the batch, go on
            for j in {id(j): j for j in bjobs}.values():  # a photo once, however many of its faces
                if id(j) in self.photos:
                    self.photos.pop(id(j))
                    self.fail(j, f"decoding failed: {type(e).__name__}: {e}")
            return False
        if cfg.measure_greedy and s.greedy_check is None and opts.k > 1:  # two more decodes
            s.greedy_check = _greedy_check(self.up.model, lrs, images, opts)
        if cfg.match_input:  # after the greedy check, which compares the decoder's own outputs
            images = match_input(images, lrs)
        for (j, n, lr), img, st in zip(batch, images, stats):
            if id(j) not in self.photos:  # the photo failed with an earlier batch
                continue
            ph, results = self.photos[id(j)]
            results[n] = (img, lr, self.row(j, ph, n, st), st)
            if len(results) == len(ph.faces):  # a photo's faces are written together
                self.finish_photo(j, ph, results)
        return True

    def row(self, j: Job, ph: Photo, n: int, st) -> dict:
        """Face n's metrics row, as decoded."""
        face = ph.faces[n]
        aligned = not isinstance(face, tuple)
        out = self.face_output(j, n, j.out)
        return {**self.names(j), "output": str(out), "relative": out.relative_to(self.cfg.outdir).as_posix(),
                "status": "done", **self.base_row, "face": n,
                "framing": face.how if aligned else ph.note, "faces_note": ph.note,
                # in the photo's own pixels (a photo over 40 MP is read at reduced size)
                "box": [round(v * ph.image.info.get("full_size", ph.image.size)[0] / ph.image.width, 1)
                        for v in face.box] if aligned else None,
                "calls": st.calls, "mean_block": round(st.mean_block, 4), "seconds": round(st.seconds, 4)}

    def progress(self, tokens, done_counts, bmap, calls):
        """The current batch's share on the bar, twice a second."""
        if time.perf_counter() - self.progress_shown > 0.5:
            from .model import SEQ_LEN  # loaded with the model by now

            self.progress_shown = time.perf_counter()
            self.bar.set_postfix_str(f"batch {done_counts.mean() / SEQ_LEN:.0%}", refresh=True)

    def fail(self, j: Job, reason: str):
        self.summary.failed.append((str(j.src), reason))
        self.metrics.add({**self.names(j), "status": "failed", "reason": reason})
        self.bar.write(f"failed: {_shown(j.src)}: {_shown(reason)}", file=sys.stderr)
        self.bar.update(1)

    # ------------------------------------------------ writing

    def finish_photo(self, j: Job, ph: Photo, results: dict) -> None:
        """A photo whose faces are all decoded: written, then counted (or failed)."""
        s = self.summary
        self.photos.pop(id(j))
        try:
            self.write_photo(j, ph, results)
        except Exception as e:  # disk full, permissions...: this image failed
            self.fail(j, f"writing failed: {type(e).__name__}: {e}")
            return
        for _, _, row, st in (results[n] for n in range(len(ph.faces))):
            self.metrics.add(row)
            s.blocks.append(st.mean_block)
            s.calls.append(st.calls)
        s.faces += len(ph.faces)
        s.done += 1
        if j.paste is not None and ph.image is not None:
            s.pasted.append((str(j.src), paste_plan_of(ph)[0].note))
        self.bar.update(1)

    def write_photo(self, j: Job, ph: Photo, results: dict) -> None:
        """A photo's outputs, once all its faces are decoded: the further faces, the pasted photo,
        then face 0 last, since --skip-existing takes a photo whose face 0 (and compare strip and
        pasted photo) exists for done: a run stopped between two of its faces leaves none written.
        A write that fails (a full disk) takes back the photo's files written before it."""
        written = []
        try:
            for n in reversed(range(len(ph.faces))):
                self.write_face(j, ph, results, n, written)
        except BaseException:
            # and, once this run has replaced any of them, an earlier run's face 0, pasted photo
            # or strip: --skip-existing would take the photo for done, with faces missing
            for path in [*written, *((j.out, j.paste, j.compare) if written else ())]:
                if path is not None and _resolve(path) not in self.info["protected"]:  # never an input
                    path.unlink(missing_ok=True)
            raise

    def write_face(self, j: Job, ph: Photo, results: dict, n: int, written: list) -> None:
        """Face n's output (and compare strip; with face 0 the pasted photo), each path added to
        `written` once it is there."""
        cfg, info = self.cfg, self.info
        img, lr, row, _ = results[n]
        face = ph.faces[n]
        aligned = not isinstance(face, tuple)
        out, compare = self.face_output(j, n, j.out), j.compare and self.face_output(j, n, j.compare)
        if _resolve(out) in info["protected"] or (compare and _resolve(compare) in info["protected"]):
            raise ValueError(f"{out} is an input file: not overwritten")
        if n > 0 and foreign_beside_inputs(out, info["input_folders"]):  # face 0's: before any work (plan)
            raise ValueError(f"{_shown(out)} {FOREIGN}")
        gt = None
        if j.gt is not None:
            row["ground_truth"] = str(j.gt)
            try:
                gt = load_ground_truth(j.gt, face if aligned else None, ph.image.size if aligned else None)
            except BadImage as e:
                row["reason"] = f"ground truth unusable: {e}"
                if n == 0 and not cfg.quiet:  # once a photo (written last)
                    self.bar.write(_shown(f"warning: {j.src}: ground truth unusable: {e}"), file=sys.stderr)
        if gt is not None:
            row["psnr"], row["ssim"] = quality(gt, img)
            row["psnr_bicubic"], row["ssim_bicubic"] = quality(gt, bicubic_upscale(lr))
        if n == 0 and j.paste is not None:  # before face 0: the photo is done when face 0 is there
            save_atomic(self.pasted_photo(ph, results, img), j.paste, cfg.ext)
            written.append(j.paste)
        if compare is not None:
            save_atomic(compare_strip(lr, img, gt), compare, cfg.ext)
            written.append(compare)
        save_atomic(img, out, cfg.ext)
        written.append(out)

    def pasted_photo(self, ph: Photo, results: dict, img: np.ndarray) -> np.ndarray:
        """--paste-back: the photo with its faces' results pasted back; each face's row gets the
        scale it was pasted at."""
        at, pasted = paste_plan_of(ph)
        if at is None:  # an 8x8 or 32x32 input: the result is the whole photo
            return img
        from .faces import paste_back
        whole = paste_back(ph.image, pasted, [results[i][0] for i in range(len(pasted))], at.scale)
        own = ph.image.info.get("full_size", ph.image.size)[0] / ph.image.width
        for i in results:  # the pasted photo's side / the photo's own (one read reduced: larger)
            results[i][2]["paste_scale"] = round(at.scale / own, 5)
        return whole

    # ------------------------------------------------ summary

    def summarise(self) -> int:
        """The summary (quiet: only what needs attention); returns the exit code."""
        s, mpath = self.summary, self.mpath
        if not self.cfg.quiet:
            print(_printable("\n".join(s.lines(self.cfg.mode))
                             + (f"\nmetrics: {_shown(mpath)}" if mpath and not s.metrics_error else "")))
        else:
            if s.failed:
                print(f"{len(s.failed)} of {s.total} images failed", file=sys.stderr)
            if s.interrupted and s.left:
                print(f"interrupted after {s.done + s.skipped} of {s.total} images", file=sys.stderr)
            if s.metrics_error:
                print(f"metrics NOT written: {s.metrics_error}", file=sys.stderr)
        return s.exit_code


def dry_paste_plan(src: Path, which: str, no_face: str) -> str:
    """--dry-run --paste-back: the scale a file's faces would be pasted back at, or why not."""
    try:
        plan, _ = paste_plan_of(load_photo(src, which, no_face))
    except BadImage as e:
        return f"not readable: {str(e).removeprefix(f'{src}: ').removeprefix(f'{src.name}: ')}"
    except Exception as e:  # whatever else a strange file does (the run reports it as failed)
        return f"not readable: {type(e).__name__}: {e}"
    return "pasted back: the 32x32 result (an 8x8 or 32x32 input)" if plan is None else f"pasted back {plan.note}"


def _greedy_check(model, lrs, images, opts) -> dict:
    """Decode the first batch again greedily (the same guidance and cell guard), at the same batch
    size: wall-clock speedup, and
    (exact mode) whether the outputs match greedy as they must. The blockwise decode is timed
    again too: the first batch of a run also pays for warming up, greedy would not."""
    from .decoding import DecodeOptions, decode
    g = decode(model, lrs, DecodeOptions(k=1, prior_weight=opts.prior_weight, guard=opts.guard))
    seconds = decode(model, lrs, opts).seconds
    return {"images": len(lrs), "seconds": seconds, "greedy_seconds": g.seconds,
            "speedup": g.seconds / seconds if seconds > 0 else math.nan,
            "identical": bool((g.images == images).all()) if opts.is_exact else None}
