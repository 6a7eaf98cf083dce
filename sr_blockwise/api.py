"""The Python API: upscale faces from your own code.

    from sr_blockwise import Upscaler
    up = Upscaler("cpu-finetuned")                # shipped weights name, or a .json / .pt path
    face = up.upscale(Image.open("me.jpg"))        # a 32x32 PIL image
    faces, stats = up.upscale([photo, array], mode="approx", return_stats=True)
    found = up.upscale_faces("group.jpg", faces="all")  # each face detected, aligned, upscaled
    whole = up.paste_back("group.jpg", found)      # the faces pasted back, at the model's scale

upscale() takes faces already framed (8x8, 32x32, CelebA's 178x218) or crops the centre square
(data.read_input); upscale_faces() finds the faces of a real photo and aligns each to the
training framing first (sr_blockwise.faces), as the batch command and the demo do; decoding is decoding.decode, in batches, each image at its own position (and,
sampling, with its own noise), so an image's output does not depend on the images decoded with
it. The batch command (`sr-blockwise upscale`) and the demo load their weights and decode through
this class and the functions it is built on.

Importing this module is cheap: torch is imported when an Upscaler is made.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from . import data

DTYPES = ("bfloat16", "float16", "float32")
# the API's, the batch command's and the demo's, so that each gives the others' faces for the same
# settings (the dtype rounds the keys and values: other dtypes give other faces of the same
# quality, experiments/decode-dtype/)
DEFAULT_DTYPE = "bfloat16"
SHORT_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # evaluate's records spell them so


def dtype_name(name: str) -> str:
    """A dtype's name in either spelling (bf16 or bfloat16, ...) -> the full one, as every command takes it."""
    return SHORT_DTYPES.get(name, name)


@dataclass
class FaceResult:
    """One face of a photo, upscaled."""
    image: Image.Image  # the 32x32 result
    box: tuple[float, float, float, float]  # left, top, right, bottom in the photo's own pixels
    landmarks: np.ndarray | None  # (5, 2): eyes, nose, mouth corners (x, y); None for a given box
    score: float  # the detector's confidence (1 for a given box, 0 for the centre square)
    # the alignment: matrix (photo as read -> 32x32 crop; a photo over 40 MP is read at reduced
    # size, data.open_rgb), the aligned crop, the 8x8 input
    face: "faces.Face"
    stats: "ImageStats"


@dataclass(frozen=True)
class ImageStats:
    """Decode statistics of one image."""
    calls: int  # model calls this image took part in (greedy decoding: one per intensity, 3072)
    mean_block: float  # intensities accepted per decoding step (the paper's mean block size)
    seconds: float  # from the start of its batch's decode until this image was finished


def pick_device(name: str) -> str:
    """'auto' (the GPU if there is one, else the CPU), 'cpu', 'cuda', 'cuda:1', ..."""
    import torch
    if name == "auto":
        if torch.cuda.is_available():  # under torchrun, each process takes its own GPU
            return f"cuda:{int(os.environ.get('LOCAL_RANK', 0)) % torch.cuda.device_count()}"
        return "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device {name!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: no CUDA GPU is available")
    return name


def torch_dtype(name):
    """'bfloat16', 'float16', 'float32' (or a torch.dtype) -> the torch.dtype."""
    import torch
    if isinstance(name, torch.dtype):
        return name
    name = dtype_name(name)
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r}: choose from {sorted(DTYPES)}")
    return getattr(torch, name)


class Upscaler:
    """Weights loaded once; upscale() as often as you like.

    weights: a shipped weights name (weights/NAME.json), a .json / .safetensors path or a training
    checkpoint .pt; None: the shipped default. device: 'auto' (the GPU if there is one), 'cpu',
    'cuda', ... dtype: 'bfloat16' (default), 'float16', 'float32' or a torch.dtype: the matrix
    products' precision (the priors and output layer stay float32). Bad weights raise
    checkpoints.WeightsError, a ValueError saying why."""

    def __init__(self, weights: str | Path | None = None, device: str = "auto", dtype=DEFAULT_DTYPE):
        from .checkpoints import default_weights, load_model
        self.dtype = torch_dtype(dtype)
        self.device = pick_device(device)
        self.weights = str(weights) if weights is not None else default_weights()
        self.model = load_model(self.weights, dtype=self.dtype, device=self.device)

    def __repr__(self) -> str:
        return f"Upscaler({self.weights!r}, device={self.device!r}, dtype={str(self.dtype).removeprefix('torch.')!r})"

    @property
    def max_k(self) -> int:
        """The largest block size k these weights decode with (their number of heads)."""
        return self.model.cfg.n_blockwise

    def options(self, mode: str = "exact", k: int | None = None, eps: int | None = None,
                temperature: float | None = None, seed: int | None = None, prior_weight: float | None = None,
                guard: float | None = None):
        """decoding.DecodeOptions for a decode mode (decoding.MODES), checked against these weights
        (decoding.mode_options). k None: the mode's default block size (decoding.DEFAULT_K: 2 for
        exact, 4 for approx and sample). eps (approx; default 2), temperature and seed (sample;
        default 1.0 and 0) are refused in the other modes, which would not read them. prior_weight
        None: the weights' default input guidance (decoding.default_prior_weight). guard None: the
        mode's default cell guard (decoding.default_guard: 32 levels, none for sample); 0 turns it off."""
        from .decoding import mode_options
        return mode_options(mode, k=k, eps=eps, temperature=temperature, seed=seed, prior_weight=prior_weight,
                            guard=guard, model=self.model)

    def decode(self, lrs: np.ndarray, opts, seeds: Sequence[int] | None = None,
               progress=None) -> tuple[np.ndarray, list[ImageStats]]:
        """One batch: 8x8 inputs (B, 8, 8, 3) uint8 -> the decoder's own outputs (B, 32, 32, 3)
        uint8 (not matched to their inputs) and each image's statistics. seeds: decode's sampling
        seed per image (sampling only); progress: decode's live callback."""
        from .decoding import decode
        r = decode(self.model, lrs, opts, progress=progress, seeds=seeds)
        return r.images, [ImageStats(int(st.calls), float(st.mean_block), float(st.seconds)) for st in r.stats]

    def upscale(self, images, mode: str = "exact", k: int | None = None, eps: int | None = None,
                temperature: float | None = None,
                seed: int | Sequence[int] | None = None, prior_weight: float | None = None, guard: float | None = None,
                match_input: bool = True, batch_size: int = 16, return_stats: bool = False):
        """Upscale one face, or a list of them, to 32x32.

        images: a PIL image, a numpy array ((H, W) grey, (H, W, 3) RGB or (H, W, 4) RGBA, integers
        0..255) or an image file path, of any size, taken as a framed face: 8x8 is used as is, 32x32
        taken as the face, 178x218 gets CelebA's crop, anything else its centre square,
        area-downsampled to 8x8 (for a real photo, upscale_faces finds and aligns its faces). One
        image gives one 32x32 RGB PIL image; a list or tuple (or an (N, H, W, C) array) gives a
        list, decoded batch_size at a time. Every input is checked before any decoding: an
        unusable one raises data.BadImage, a ValueError saying why (and, in a list, which).

        mode: greedy, exact (blockwise, the same output as greedy), approx (blockwise, accepting
        proposals within eps levels, default 2) or sample (at `temperature`, default 1.0; with k > 1
        by speculative sampling, the same distribution in fewer calls); eps and temperature are
        refused in the modes that would not read them. k: block size, 1..max_k (None: the mode's
        default, decoding.DEFAULT_K). seed (sample; None: 0, refused in the other modes):
        an int for every image, or one per image; an image's sample depends on its input and
        seed only. prior_weight: input guidance, None for the weights' default. guard: the cell
        guard's tolerance in levels (decoding.cell_guard), None for the mode's default
        (decoding.default_guard), 0 for none. match_input: shift
        each output's 4x4 blocks so that they average to the 8x8 input (data.match_input), as the
        batch command does by default. return_stats: also return ImageStats (one, or a list)."""
        single = not (isinstance(images, (list, tuple)) or (isinstance(images, np.ndarray) and images.ndim == 4))
        items = [images] if single else list(images)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        from .decoding import check_seed
        from .decoding.sampling import SEED_STRIDE  # s * SEED_STRIDE: seed s's sample, as alone
        per_image = isinstance(seed, (list, tuple, np.ndarray))
        seeds = list(seed) if per_image else [0 if seed is None else seed] * len(items)
        for s in seeds:  # every image's seed, not only the first one the options see: before any decoding
            check_seed(s)
        if len(seeds) != len(items):
            raise ValueError(f"got {len(seeds)} seeds for {len(items)} images")
        opts = self.options(mode, k=k, eps=eps, temperature=temperature,
                            seed=None if seed is None else int(seeds[0]) if seeds else 0,
                            prior_weight=prior_weight, guard=guard)
        lrs = np.stack([self.prepare(x, None if single else f"image {i}") for i, x in enumerate(items)]) \
            if items else np.zeros((0, 8, 8, 3), np.uint8)
        outs, stats = [], []
        for start in range(0, len(items), batch_size):
            lr = lrs[start:start + batch_size]
            batch_seeds = [int(s) * SEED_STRIDE for s in seeds[start:start + batch_size]] if opts.temperature > 0 else None
            imgs, st = self.decode(lr, opts, seeds=batch_seeds)
            if match_input:
                imgs = data.match_input(imgs, lr)
            outs += [Image.fromarray(img) for img in imgs]
            stats += st
        if single:
            return (outs[0], stats[0]) if return_stats else outs[0]
        return (outs, stats) if return_stats else outs

    def upscale_faces(self, photo, faces: str = "all", boxes=(), if_none: str = "centre",
                      **options) -> list[FaceResult]:
        """Find the faces of a photo (a file path, PIL image or numpy array), align each to the
        training framing, and upscale them: a FaceResult per face, largest first. faces: all,
        largest (sooner: the search for faces stops at it) or none (no detection: the photo's
        centre square, as the batch command's --faces none); boxes: faces given by hand as (left,
        top, right, bottom) in the photo's pixels instead of detection (e.g. one too small to
        detect; an empty list: detect); if_none: centre (the centre square), skip (an empty list)
        or error (data.BadImage) when no face is found. options: upscale()'s (mode, k, eps, ...)."""
        from . import faces as F
        # the decode options checked before detection: a photo with no face refuses what no mode reads
        self.options(**{k: v for k, v in options.items() if k in ("mode", "k", "eps", "temperature",
                                                                   "prior_weight", "guard")})
        img = _photo(photo)
        boxes = _boxes(boxes)
        r = F.own_scale(img)  # the photo's own px per px read
        found, _ = F.faces_of(img, faces, [[v / r for v in b] for b in boxes], if_none)
        if not found:
            return []
        outs, stats = self.upscale([Image.fromarray(f.lr) for f in found], return_stats=True, **options)
        return [FaceResult(o, tuple(v * r for v in f.box) if r != 1 else f.box,
                           None if f.landmarks is None else f.landmarks * r, f.score, f, st)
                for o, f, st in zip(outs, found, stats)]

    @staticmethod
    def paste_back(photo, results: Sequence[FaceResult], scale: float | None = None,
                   return_plan: bool = False) -> Image.Image:
        """The photo with each face replaced by its result (warped back and blended in with a
        feathered mask, faces.paste_back), at the scale the model works at (faces.paste_plan, as
        the batch command and the demo choose it): where a face is larger than the 32x32 output,
        the photo reduced so that its largest face is 8 px, then enlarged 4x; otherwise the photo
        4x (less where that would pass 64 MP). scale: that scale instead, of the photo as read
        (one over 40 MP is read at reduced size; below 1: the photo reduced to scale / 4, then
        4x). return_plan: also return the faces.PastePlan (its scale, the face that set it, the
        faces too small at it, a line saying so). Every result given is pasted, a centre square
        too (the batch command leaves out the centre square of a photo where no face was found)."""
        from . import faces as F
        if isinstance(results, FaceResult):
            results = [results]
        if not isinstance(results, Sequence):
            got = type(results).__name__
        else:
            others = sorted({type(r).__name__ for r in results if not isinstance(r, FaceResult)})
            got = f"a {type(results).__name__} holding {', '.join(others)}" if others else None
        if got:
            raise ValueError(f"results: the FaceResults that upscale_faces returned for this photo, got {got}")
        if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                      and math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale: the pasted photo's size / the photo's, a number above 0; got {scale!r}")
        img = _photo(photo)
        plan = F.paste_plan(img.size, [r.face for r in results], scale, own_size=img.info.get("full_size"))
        whole = Image.fromarray(F.paste_back(img, [r.face for r in results], [np.asarray(r.image) for r in results],
                                             plan.scale))
        return (whole, plan) if return_plan else whole

    @staticmethod
    def prepare(image, label: str | None = None) -> np.ndarray:
        """One image (as upscale takes it) -> its 8x8x3 uint8 input. label: named in the error."""
        try:
            return data.read_input(image)[0]
        except data.BadImage as e:
            if label is None:
                raise
            raise data.BadImage(f"{label}: {e}") from None


def _boxes(boxes) -> list[tuple[float, ...]]:
    """Faces given by hand: one (left, top, right, bottom) box or a list of them -> a list of
    4-float tuples, corners in either order as the demo takes a drawn or typed box (ValueError
    saying what a box is otherwise)."""
    def number(v):
        return (isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_))
                and math.isfinite(v))
    if boxes is None:
        return []
    if isinstance(boxes, np.ndarray):
        boxes = boxes.tolist()
    if isinstance(boxes, (list, tuple)) and len(boxes) == 4 and all(number(v) for v in boxes):
        boxes = [boxes]  # one box
    out = []
    for b in boxes if isinstance(boxes, (list, tuple)) else [boxes]:
        if isinstance(b, np.ndarray):
            b = b.tolist()
        if not (isinstance(b, (list, tuple)) and len(b) == 4 and all(number(v) for v in b)):
            raise ValueError(f"boxes: a face box is (left, top, right, bottom), four numbers in the "
                             f"photo's pixels; got {b!r}")
        l, t, r, b = (float(v) for v in b)
        out.append((min(l, r), min(t, b), max(l, r), max(t, b)))
    return out


def _photo(source) -> Image.Image:
    """A file path, PIL image or numpy array -> an RGB PIL image (data.BadImage if unusable)."""
    if isinstance(source, Image.Image):
        return data.to_rgb(source)
    if isinstance(source, np.ndarray):
        return data.to_rgb(data.array_to_image(source))
    if isinstance(source, (str, os.PathLike)) or hasattr(source, "read"):
        return data.open_rgb(os.fspath(source) if isinstance(source, os.PathLike) else source)
    raise data.BadImage(f"expected an image file, a PIL image or a numpy array, got {type(source).__name__}")
