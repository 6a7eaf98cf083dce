"""The batch command's settings and plan: inputs found (files, folders, globs), their outputs
named in a mirrored tree, ground truth matched, the shard's share; bad arguments refused before
any work."""
from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from PIL import Image

from ..api import DEFAULT_DTYPE
from ..data import IMAGE_EXTS
from ..faces import WHICH as FACES  # --faces: largest, all, none
from .files import FOREIGN, SAVE_ARGS, _resolve, foreign_beside_inputs
from .report import _shown

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


def _check_plan_args(cfg: Config, outdir: Path) -> None:
    """Refuse an OUTDIR that is a file, and output and face settings out of their choices."""
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


def _jobs_below_base(found: list[tuple[Path, Path]]) -> tuple[Path, list[Job]]:
    """The common folder of all inputs and a job per input file, sorted by its path below it (the
    tree the outputs mirror)."""
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
    return base, [jobs[r] for r in sorted(jobs)]


def _output_name(j: Job, cfg: Config, outdir: Path, with_ext: bool, part: str = "") -> Path:
    """STEM+SUFFIX.EXT in the mirrored folder (with_ext: STEM_EXT+SUFFIX.EXT; part before the suffix)."""
    stem = j.rel.stem + (f"_{j.rel.suffix.lstrip('.').lower()}" if with_ext else "")
    return outdir.joinpath(*j.rel.parent.parts, f"{stem}{part}{cfg.suffix}.{cfg.ext}")


def _name_outputs(ordered: list[Job], cfg: Config, outdir: Path) -> dict[Path, Job]:
    """Set each job's output, compare strip and pasted photo paths; returns every output path's job,
    refusing two jobs that would write the same path."""
    # output names: STEM+SUFFIX.EXT in the mirrored folder; photo.jpg and photo.png side by side
    # would collide, so those keep their input extension in the name (photo_jpg.png)
    # (with --faces all: STEM_face0+SUFFIX.EXT, the further faces STEM_face1..., see face_output)
    counts = {}
    for j in ordered:
        plain = _output_name(j, cfg, outdir, False)
        counts[plain] = counts.get(plain, 0) + 1
    for j in ordered:
        with_ext = counts[_output_name(j, cfg, outdir, False)] > 1
        j.out = _output_name(j, cfg, outdir, with_ext, "_face0" if cfg.faces == "all" else "")
        if cfg.compare:
            j.compare = j.out.with_name(f"{j.out.stem}_compare.{cfg.ext}")
        if cfg.paste_back:  # NAME{SUFFIX}_pasted, as the compare strip: the suffix ends the output's name
            whole = _output_name(j, cfg, outdir, with_ext)
            j.paste = whole.with_name(f"{whole.stem}_pasted.{cfg.ext}")
    outs = {}
    for j in ordered:
        for o in (j.out, j.compare, j.paste):
            if o is not None and outs.setdefault(o, j) is not j:
                raise ValueError(f"{j.src} and {outs[o].src} would both be written to {o}; "
                                 "rename one or run them separately")
    return outs


def _match_ground_truth(ordered: list[Job], ground_truth: str) -> None:
    """Set each job's ground truth: the file of the same relative folder and stem (the same name first)."""
    gt_dir = Path(ground_truth)
    if not gt_dir.is_dir():
        raise FileNotFoundError(f"--ground-truth {gt_dir}: no such folder")
    index = _gt_index(gt_dir)
    for j in ordered:
        cands = index.get((str(j.rel.parent), j.rel.stem), [])
        exact = [c for c in cands if c.name == j.rel.name]
        j.gt = (exact or cands or [None])[0]


def _refuse_overwrites(ordered: list[Job], outs: dict[Path, Job], outdir: Path, skip_existing: bool) -> tuple[set, set]:
    """Refuse, before any work, outputs that would overwrite an input or another file beside the
    inputs; returns the protected inputs and the folders that hold inputs."""
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
        if skip_existing and already_done(j):
            continue
        for o in (j.out, j.compare, j.paste):
            if o is not None and foreign_beside_inputs(o, input_folders):
                raise ValueError(f"{_shown(o)} {FOREIGN}: choose another OUTDIR, or --suffix / --ext, or "
                                 "--skip-existing to leave the input and its outputs alone")
    return protected, input_folders


def plan(cfg: Config) -> tuple[list[Job], list[Path], dict]:
    """All jobs of this shard, sorted by relative path; raises ValueError for bad arguments."""
    outdir = Path(cfg.outdir)
    _check_plan_args(cfg, outdir)
    found, folders, ignored = find_inputs(cfg.inputs, outdir)
    # mirror the tree below the common folder of all inputs
    base, ordered = _jobs_below_base(found)
    outs = _name_outputs(ordered, cfg, outdir)
    if cfg.ground_truth:
        _match_ground_truth(ordered, cfg.ground_truth)
    # inputs are never overwritten: refuse before any work
    protected, input_folders = _refuse_overwrites(ordered, outs, outdir, cfg.skip_existing)

    i, n = parse_shard(cfg.shard)
    mine = [j for j in ordered if shard_of(j.rel, n) == i]
    out_res = _resolve(outdir)
    info = {"base": base, "folders": folders, "ignored": ignored, "total": len(ordered), "shard": (i, n),
            "protected": protected, "input_folders": input_folders,
            # an OUTDIR inside an input folder is not searched for inputs: the first line says so
            "outdir_inside": any(_resolve(d) in out_res.parents for d in folders)}
    return mine, ignored, info
