"""Faces in, 8x8 inputs and 32x32 targets out, with one fixed split.

Sources: a CelebA download (img_align_celeba/ + list_eval_partition.txt), a prepared array file
(.npz with `images` (N,32,32,3) uint8 and optionally `celeba_id`, `split`), or a plain folder of
photos. Every dataset photo goes through `photo_to_32` (the paper's crop, or the centre square);
the demo, the batch command and the API first find and align a photo's faces
(sr_blockwise.faces) and make the input from the aligned 32x32 crop. 8x8 inputs are always the
4x4 box average of a 32x32 face (downsample_8, through image_to_input on every path).

The split (written down in data/README.md): held-out TEST = CelebA test-partition ids with
id % 16 == 0; VAL = the official validation partition; TRAIN = everything else. Training never
sees TEST.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image, ImageOps
from tqdm import tqdm

# the token layout the model reads and writes: intensities in raster order (row, column, channel)
IMAGE_SIZE = 32
INPUT_SIZE = 8
CHANNELS = 3
SEQ_LEN = IMAGE_SIZE * IMAGE_SIZE * CHANNELS  # 3072 target tokens
SRC_LEN = INPUT_SIZE * INPUT_SIZE * CHANNELS  # 192 source tokens
VOCAB = 256
CELEBA_BOX = (20, 40, 158, 178)  # left, top, right, bottom: the 138x138 crop of tensor2tensor
# Photos up to FULL_READ_PIXELS are decoded at full size (up to 120 MB of RGB), so their inputs
# are exactly those of a full-resolution read. Larger ones, up to Pillow's decompression-bomb
# limit (PIL.Image.MAX_IMAGE_PIXELS), are read at reduced size, with at least REDUCED_MIN_SIDE
# pixels on the shorter side: a JPEG decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, in
# bounded memory), other formats decoded in their own mode and box-reduced by a whole factor. The
# 8x8 input averages hundreds of pixels per cell either way, so it moves by well under a level.
FULL_READ_PIXELS = 40_000_000
# Pillow warns of a "decompression bomb" from MAX_IMAGE_PIXELS (89 MP) on and refuses twice that;
# open_rgb reads what it allows as above, so the warning only clutters a batch run's output
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
REDUCED_MIN_SIDE = 1024
_REDUCIBLE = {"L", "LA", "RGB", "RGBA", "I", "F"}  # modes Image.reduce averages as they are
IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
SPLITS = {"train": 0, "val": 1, "test": 2}

DEFAULT_DATA = Path(os.environ.get("SR_BLOCKWISE_DATA",
                                   Path(__file__).resolve().parent.parent.parent / "shared" / "data"))


class BadImage(ValueError):
    """An input that is not a usable image; the message says why."""


# ---------------------------------------------------------------- single images

def open_rgb(path_or_file) -> Image.Image:
    """Open any Pillow-readable image as RGB; transparency is flattened onto white. Photos larger
    than FULL_READ_PIXELS are read at reduced size (see there); the returned image's
    info["full_size"] then holds the photo's own (width, height), as it is shown."""
    name = getattr(path_or_file, "name", path_or_file)
    try:
        if isinstance(path_or_file, (str, Path)) and os.path.getsize(path_or_file) == 0:
            raise BadImage(f"{name}: empty file (0 bytes)")
        img, full = Image.open(path_or_file), None
        if img.width * img.height > FULL_READ_PIXELS and min(img.size) >= 2 * REDUCED_MIN_SIDE:
            img, full = _read_reduced(img)
        else:
            img.load()
    except BadImage:
        raise
    except Image.DecompressionBombError as e:
        raise BadImage(f"{name}: image too large ({e})") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise BadImage(f"{name}: not a readable image ({e})") from None
    rgb = to_rgb(img)
    if full is not None:
        rgb.info["full_size"] = full
    return rgb


def _read_reduced(img: Image.Image) -> tuple[Image.Image, tuple[int, int]]:
    """A large photo, opened but not loaded, decoded at reduced size (FULL_READ_PIXELS), and its
    full (width, height) as shown (after its EXIF orientation)."""
    w, h = img.size
    s = min(w, h) // REDUCED_MIN_SIDE
    img.draft("RGB", (w // s, h // s))  # JPEG: decode at the largest DCT scale still >= that; else no-op
    img.load()
    before = img.size
    ImageOps.exif_transpose(img, in_place=True)  # here: the reduced copy below loses the EXIF of some formats
    full = (h, w) if img.size != before else (w, h)
    if img.mode not in _REDUCIBLE:  # 1-bit, palette, 16-bit: averaging needs intensities
        img = img.convert("L") if img.mode == "1" else to_rgb(img)
    factor = min(img.size) // REDUCED_MIN_SIDE
    if factor >= 2:
        img = img.reduce(factor)  # box average; RGBA premultiplied, so flattening later is the same
    return img, full


def to_rgb(img: Image.Image) -> Image.Image:
    """Any image -> RGB, upright by its EXIF orientation; 16-bit grey keeps its top 8 bits, and
    transparency is flattened onto white. An upright RGB image is returned as it is (no copy)."""
    if img.mode == "RGB" and img.getexif().get(ExifTags.Base.Orientation, 1) not in range(2, 9):
        return img
    img = ImageOps.exif_transpose(img)
    if img.mode.startswith("I;16") or img.mode == "I":
        # 16-bit grey: convert("RGB") clips the values at 255 (white); keep the top 8 bits instead
        a = np.clip(np.asarray(img, dtype=np.int64), 0, 65535) >> 8
        img = Image.fromarray(a.astype(np.uint8), "L")
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        img = img.convert("RGBA")
        bg = Image.new("RGBA", img.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, img).convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")  # exif_transpose returned a copy


def center_square(img: Image.Image) -> Image.Image:
    s = min(img.size)
    left, top = (img.width - s) // 2, (img.height - s) // 2
    return img.crop((left, top, left + s, top + s))


def photo_to_32(img: Image.Image, celeba_aligned: bool | None = None) -> np.ndarray:
    """A face photo -> (32,32,3) uint8. CelebA-aligned 178x218 photos get the paper's crop;
    anything else a centre square crop. Area (box) resampling."""
    img = to_rgb(img)
    if celeba_aligned is None:
        celeba_aligned = img.size == (178, 218)
    img = img.crop(CELEBA_BOX) if celeba_aligned else center_square(img)
    return np.asarray(img.resize((32, 32), Image.Resampling.BOX), dtype=np.uint8)


def downsample_8(img32: np.ndarray) -> np.ndarray:
    """(..., 32, 32, 3) uint8 -> (..., 8, 8, 3) uint8: 4x4 box average, rounded half up."""
    a = np.asarray(img32, dtype=np.int32)
    s = a.reshape(*a.shape[:-3], 8, 4, 8, 4, 3).sum(axis=(-4, -2))
    return ((s + 8) // 16).astype(np.uint8)


def match_input(img32: np.ndarray, lr8: np.ndarray) -> np.ndarray:
    """Back-projection: shift each 4x4 block of (..., 32, 32, 3) uint8 outputs, per channel, so
    that its mean is the 8x8 input's cell again (downsample_8's constraint), and round. Pixels stop
    at 0 and 255, so the shift s solves mean(clip(block + s)) = cell, by bisection (the limit of
    the usual repeated back-projection). A decode that collapsed into a flat wrong colour (a red
    patch over a dark cell) becomes the cell's own colour; elsewhere the texture stays and only its
    colour moves. Measured on greedy outputs of the first 96 held-out faces: ST-LPIPS -0.021 and
    PSNR +0.53 dB, better on 96 of 96 faces (experiments/match-input/); 1.2-1.4 ms an image."""
    x = np.asarray(img32, dtype=np.float64)
    blocks = x.reshape(*x.shape[:-3], 8, 4, 8, 4, 3)
    target = np.asarray(lr8, dtype=np.float64)[..., :, None, :, None, :]
    lo, hi = np.full_like(target, -255.0), np.full_like(target, 255.0)
    for _ in range(40):  # the mean is monotone in s: 510 / 2**40 levels at the end
        mid = (lo + hi) / 2
        low = np.clip(blocks + mid, 0, 255).mean(axis=(-4, -2), keepdims=True) < target
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    out = np.clip(blocks + (lo + hi) / 2, 0, 255).reshape(x.shape)
    return np.round(out).astype(np.uint8)


def image_to_input(img: Image.Image) -> tuple[np.ndarray, np.ndarray | None]:
    """The one function every front end uses: a photo -> (8x8x3 input, 32x32 face or None).
    An 8x8 image is used as is; a 32x32 one is taken as the face; larger ones are cropped."""
    img = to_rgb(img)
    if 0 in img.size:
        raise BadImage(f"image is {img.width}x{img.height}: it has no pixels")
    if img.size == (8, 8):
        return np.asarray(img, dtype=np.uint8), None
    face = np.asarray(img, dtype=np.uint8) if img.size == (32, 32) else photo_to_32(img)
    return downsample_8(face), face


def read_input(source) -> tuple[np.ndarray, np.ndarray | None]:
    """What every front end (the Python API, the batch command, the demo) feeds the model: an image
    file (a path or an open binary file), a PIL image or a numpy array -> (8x8x3 input, 32x32 face
    or None), through open_rgb and image_to_input. Raises BadImage (a ValueError) saying why a
    source is not a usable image."""
    if isinstance(source, Image.Image):
        img = source
    elif isinstance(source, np.ndarray):
        img = array_to_image(source)
    elif isinstance(source, (str, os.PathLike)) or hasattr(source, "read"):
        img = open_rgb(os.fspath(source) if isinstance(source, os.PathLike) else source)
    else:
        raise BadImage(f"expected an image file, a PIL image or a numpy array, got {type(source).__name__}")
    return image_to_input(img)


def array_to_image(a: np.ndarray) -> Image.Image:
    """A numpy image -> PIL: (H, W) or (H, W, 1) grey, (H, W, 3) RGB, (H, W, 4) RGBA, with
    intensities 0..255 (uint8, or another integer type within that range)."""
    a = np.asarray(a)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] not in (3, 4)):
        raise BadImage(f"expected an image array of shape (H, W), (H, W, 3) or (H, W, 4), got {a.shape}")
    if a.size == 0:
        raise BadImage(f"image is {a.shape[1]}x{a.shape[0]}: it has no pixels")
    return Image.fromarray(np.ascontiguousarray(_intensities(a)))  # mode from the shape: L, RGB, RGBA


def _intensities(a: np.ndarray) -> np.ndarray:
    """Integer intensities 0..255 as uint8; anything else (floats, bools, out of range) is refused."""
    if a.dtype != np.uint8:
        if not np.issubdtype(a.dtype, np.integer):
            raise BadImage(f"expected uint8 intensities 0..255, got dtype {a.dtype}")
        if a.min() < 0 or a.max() > 255:
            raise BadImage(f"expected intensities in 0..255, got range {a.min()}..{a.max()}")
        a = a.astype(np.uint8)
    return a


def check_input(lr: np.ndarray) -> np.ndarray:
    """Validate a batch of 8x8 inputs: (8,8,3) or (B,8,8,3) uint8 (or ints in 0..255)."""
    lr = np.asarray(lr)
    if lr.ndim == 3:
        lr = lr[None]
    if lr.ndim != 4 or lr.shape[1:] != (8, 8, 3):
        raise ValueError(f"expected 8x8 RGB input of shape (8, 8, 3) or (B, 8, 8, 3), got {lr.shape}")
    return _intensities(lr)


# ---------------------------------------------------------------- datasets

@dataclass
class Faces:
    images: np.ndarray  # (N, 32, 32, 3) uint8
    ids: np.ndarray  # (N,) int64 CelebA id, or -1
    split: np.ndarray  # (N,) int64: 0 train, 1 val, 2 test (-1 unknown)
    names: list[str]
    skipped: list[tuple[str, str]]  # (path, reason) of inputs that could not be used

    def __len__(self):
        return len(self.images)

    def subset(self, mask) -> "Faces":
        idx = np.flatnonzero(mask)
        return Faces(self.images[idx], self.ids[idx], self.split[idx],
                     [self.names[i] for i in idx], self.skipped)

    def part(self, name: str) -> "Faces":
        """The project's fixed split: 'train', 'val', 'test' (held-out) or 'all'."""
        if name == "all":
            return self
        return self.subset(part_mask(name, self.ids, self.split))


def part_mask(name: str, ids: np.ndarray, split: np.ndarray) -> np.ndarray:
    """The split rule (data/README.md), from CelebA ids and official partitions alone."""
    ids, split = np.asarray(ids), np.asarray(split)
    if name == "all":
        return np.ones(len(ids), bool)
    if len(split) and (split < 0).all():  # unlabelled folder: everything is "test"
        return np.full(len(ids), name == "test")
    heldout = (split == 2) & (ids % 16 == 0)
    masks = {"test": heldout, "val": split == 1, "train": (split != 1) & ~heldout}
    if name not in masks:
        raise ValueError(f"unknown split {name!r}: use train, val, test or all")
    return masks[name]


def load_faces(path: str | Path | None = None, limit: int | None = None, progress: bool = False,
               part: str | None = None) -> Faces:
    """Load faces from an .npz, a CelebA folder, or a folder of photos. `part` keeps one part of
    the split; for a CelebA folder it filters before reading, so only those photos are decoded."""
    faces = _load_any(path, limit, progress, part)
    return faces if part is None else faces.part(part)


def _load_any(path, limit, progress, part) -> Faces:
    path = Path(path) if path is not None else DEFAULT_DATA / "celeba32.npz"
    if not path.exists():
        raise FileNotFoundError(f"data path does not exist: {path}")
    if path.is_file() and path.suffix == ".npz":
        return _load_npz(path, limit)
    if path.is_dir() and (path / "celeba32.npz").exists():
        return _load_npz(path / "celeba32.npz", limit)
    if path.is_dir() and (path / "img_align_celeba").is_dir():
        return _load_celeba(path, limit, progress, part)
    if path.is_dir():
        return _load_folder(path, limit, progress)
    raise ValueError(f"{path}: expected a .npz array file, a CelebA folder or a folder of images")


def _load_npz(path: Path, limit) -> Faces:
    with np.load(path, allow_pickle=False) as d:
        if "images" not in d.files:
            raise ValueError(f"{path}: no 'images' array (found {d.files})")
        images = d["images"]
        n = len(images)
        ids = d["celeba_id"] if "celeba_id" in d.files else np.full(n, -1, np.int64)
        split = d["split"] if "split" in d.files else np.full(n, -1, np.int64)
    if images.ndim != 4 or images.shape[1:] != (32, 32, 3) or images.dtype != np.uint8:
        raise ValueError(f"{path}: 'images' must be (N, 32, 32, 3) uint8, got {images.shape} {images.dtype}")
    if n == 0:
        raise ValueError(f"{path}: the dataset is empty")
    sl = slice(None, limit)
    return Faces(images[sl], ids[sl].astype(np.int64), split[sl].astype(np.int64),
                 [f"{path.name}[{i}]" for i in range(n)][sl], [])


def _read_many(paths, celeba_aligned, progress):
    images, names, skipped = [], [], []
    for p in tqdm(paths, desc="reading faces", disable=not progress, unit="img"):
        try:
            images.append(photo_to_32(open_rgb(p), celeba_aligned))
            names.append(str(p))
        except BadImage as e:
            skipped.append((str(p), str(e)))
    return images, names, skipped


def _load_celeba(root: Path, limit, progress, part=None) -> Faces:
    part_file = root / "list_eval_partition.txt"
    partition = {}
    if part_file.exists():
        for line in part_file.read_text().split("\n"):
            if line.strip():
                name, s = line.split()
                partition[name] = int(s)
    files = sorted(p for p in (root / "img_align_celeba").iterdir() if p.suffix.lower() in IMAGE_EXTS)
    if part is not None and partition:
        ids = np.array([int(p.stem) if p.stem.isdigit() else -1 for p in files])
        keep = part_mask(part, ids, np.array([partition.get(p.name, -1) for p in files]))
        files = [f for f, k in zip(files, keep) if k]
    files = files[:limit]
    images, names, skipped = _read_many(files, True, progress)
    if not images:
        raise ValueError(f"{root}: no readable images ({len(skipped)} skipped)")
    ids = np.array([int(Path(n).stem) if Path(n).stem.isdigit() else -1 for n in names], np.int64)
    split = np.array([partition.get(Path(n).name, -1) for n in names], np.int64)
    return Faces(np.stack(images), ids, split, names, skipped)


def _load_folder(root: Path, limit, progress) -> Faces:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTS)[:limit]
    images, names, skipped = _read_many(files, None, progress)
    if not images:
        raise ValueError(f"{root}: no readable images ({len(skipped)} skipped)")
    n = len(images)
    return Faces(np.stack(images), np.full(n, -1, np.int64), np.full(n, -1, np.int64), names, skipped)


def save_faces(faces: Faces, out: str | Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".tmp.npz")
    np.savez_compressed(tmp, images=faces.images, celeba_id=faces.ids, split=faces.split)
    os.replace(tmp, out)


# ---------------------------------------------------------------- tokens

def to_tokens(img: np.ndarray) -> np.ndarray:
    """(..., H, W, 3) uint8 -> (..., H*W*3) int64 in raster (row, col, channel) order."""
    img = np.asarray(img)
    return img.reshape(*img.shape[:-3], -1).astype(np.int64)


def from_tokens(tokens, size: int = 32) -> np.ndarray:
    t = np.asarray(tokens)
    return t.reshape(*t.shape[:-1], size, size, 3).astype(np.uint8)


def bicubic_upscale(lr: np.ndarray, size: int = 32) -> np.ndarray:
    """(8,8,3) or (B,8,8,3) uint8 -> bicubic upscaling to size x size (the baseline row)."""
    lr = np.asarray(lr, dtype=np.uint8)
    if lr.ndim == 4:
        return np.stack([bicubic_upscale(x, size) for x in lr])
    return np.asarray(Image.fromarray(lr).resize((size, size), Image.Resampling.BICUBIC), dtype=np.uint8)


def enlarge(img: np.ndarray, scale: int = 8) -> np.ndarray:
    """Nearest-neighbour enlargement for showing tiny images with visible pixels."""
    return np.repeat(np.repeat(np.asarray(img), scale, axis=-3), scale, axis=-2)
