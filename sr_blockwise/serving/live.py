"""The demo's logic, apart from the page: a photo's faces for the page to choose from (found and
aligned by sr_blockwise.faces, or boxed by hand), and live decoding in a worker thread whose
progress callback hands frames to a generator (the page streams them), with the numbers shown.
apps/demo.py wires these into Gradio.

Importing this module is cheap: torch is imported when decoding starts.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ..data import BadImage, from_tokens, image_to_input, open_rgb

GREEDY_CALLS = 3072  # = sr_blockwise.model.SEQ_LEN (greedy: one call per intensity); not imported: it loads torch
FILL = 220  # intensity shown for tokens not decoded yet (light grey)
# viridis, 5 stops: block map colours from 1 token per call (dark) to k (yellow)
VIRIDIS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], float)
CENTRE = "centre square"  # a face choice: the photo's centre square, no detection
VIEW_SIDE = 640  # the photo is shown (with its face boxes) at most this large
PASTE_VIEW_SIDE = 768  # the pasted-back view: the face's surroundings, at most this large


# ---------------------------------------------------------------- inputs

@dataclass
class PhotoFaces:
    """An uploaded file and the faces the page offers for it."""
    image: Image.Image  # as read (large photos at reduced size)
    name: str  # the file's name (never the server's temporary path)
    size: tuple[int, int]  # the photo's own (width, height)
    faces: list  # sr_blockwise.faces.Face, largest first; empty for 8x8 / 32x32 inputs
    note: str  # what was found


@dataclass
class Prepared:
    lr: np.ndarray  # (8, 8, 3) uint8: what the model sees
    face: np.ndarray | None  # (32, 32, 3) uint8: the real 32x32 when the input had one
    note: str  # how the input was made, for the page
    info: dict
    photo: PhotoFaces | None = None
    chosen: object | None = None  # the sr_blockwise.faces.Face used, for pasting back


PHOTO_CACHE = 8  # photos whose faces are kept: the page's preview and its upscale detect once


def read_photo(path: str | Path, which: str = "all") -> PhotoFaces:
    """An uploaded file -> its faces (detected, largest first; which="largest": the largest
    alone, found sooner), the last PHOTO_CACHE photos' by their bytes remembered. Raises BadImage
    with a message naming the file (never the server's temp path)."""
    import dataclasses
    import hashlib
    name = Path(path).name
    try:
        key = which + ":" + hashlib.sha1(Path(path).read_bytes()).hexdigest()
    except OSError:  # open_rgb says why
        key = None
    with _photo_lock:
        hit = _photos.get(key)
    if hit is not None:
        return dataclasses.replace(hit, name=name)
    with _detecting:
        photo = _read_photo(path, name, which)
    if key is not None:
        with _photo_lock:
            _photos[key] = photo
            while len(_photos) > PHOTO_CACHE:
                _photos.pop(next(iter(_photos)))
    return photo


_photos: dict[str, PhotoFaces] = {}
_photo_lock = threading.Lock()
# photos read and searched for faces at once, the page's and the HTTP API's together: one per
# core; more would only share the cores and hold more photos in memory
_detecting = threading.BoundedSemaphore(2)


def _read_photo(path: str | Path, name: str, which: str) -> PhotoFaces:
    try:
        img = open_rgb(str(path))
    except BadImage as e:
        raise BadImage(str(e).replace(str(path), name)) from None
    from .. import faces as F
    size = img.info.get("full_size", img.size)  # a large photo is read at reduced size
    found, note = F.faces_of(img, which, if_none="skip")
    if found and found[0].as_is:  # the model's input or its face: no face of a photo to offer
        return PhotoFaces(img, name, size, [], "used as it is")
    return PhotoFaces(img, name, size, found, note)


def parse_choice(choice: str | None) -> int | tuple | str:
    """The page's face choice: "" or a face number (1 = the largest), "centre square", or a box
    "left, top, right, bottom" in the photo's pixels. -> an index (0-based), a box or CENTRE."""
    c = (choice or "").strip().lower()
    if c in ("", "largest"):
        return 0
    if c == CENTRE:
        return CENTRE
    parts = [p for p in c.replace("box", "").replace(":", " ").replace(",", " ").split() if p]
    if len(parts) == 1 and parts[0].isascii() and parts[0].isdigit() and int(parts[0]) >= 1:  # "1e3", "²": no face number
        return int(parts[0]) - 1
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        nums = []
    if len(nums) == 4 and all(math.isfinite(v) for v in nums):
        l, t, r, b = nums  # corners in either order, as a drawn box
        return (min(l, r), min(t, b), max(l, r), max(t, b))
    raise BadImage(f"face {choice!r}: give a face number (1 = the largest), 'centre square' or a box "
                   "'left, top, right, bottom' in the photo's pixels")


def prepare_input(path: str | Path, choice: str | None = "") -> Prepared:
    """An uploaded file and a face choice (parse_choice) -> the 8x8 input, the real 32x32 and a
    note. 8x8 and 32x32 images are used as they are. No face found: the centre square, said."""
    return prepare_photo(read_photo(path), choice)


def prepare_photo(photo: PhotoFaces, choice: str | None = "") -> Prepared:
    """prepare_input for a photo read (read_photo)."""
    from .. import faces as F
    w, h = photo.size
    info = {"file": photo.name, "size": [w, h], "faces_found": len(photo.faces)}
    if (w, h) == (8, 8):
        lr, face = image_to_input(photo.image)
        return Prepared(lr, face, "8x8 image: used as is", {**info, "face": "as is"}, photo)
    if (w, h) == (32, 32):
        lr, face = image_to_input(photo.image)
        return Prepared(lr, face, "32x32 image: taken as the face, area-downsampled to 8x8",
                        {**info, "face": "as is"}, photo)
    which = parse_choice(choice)
    r = photo.image.width / w  # photo pixels -> pixels of the copy read (large photos are reduced)
    if isinstance(which, tuple):
        f = F.face_in_box(photo.image, [v * r for v in which])
        how = f"the box {', '.join(f'{v:g}' for v in which)}"
    elif which == CENTRE or not photo.faces:
        f = F.centre_face(photo.image)
        how = "the centre square" + ("" if which == CENTRE else " (no face found: pick one by drawing a box)")
    elif which >= len(photo.faces):
        raise BadImage(f"face {which + 1}: {len(photo.faces)} face{'s' * (len(photo.faces) != 1)} found "
                       "in the photo")
    else:
        f = photo.faces[which]
        how = f"face {which + 1} of {len(photo.faces)} found, aligned to the training framing"
    side = f.size / r
    note = f"{w}x{h} photo: {how}; a {side:.0f} px square, area-downsampled to 32x32 and 8x8"
    info.update(face=f.as_dict(), note=note)
    return Prepared(f.lr, f.crop, note, info, photo, f)


def photo_view(photo: PhotoFaces, chosen=None, corner=None) -> np.ndarray:
    """The photo at most VIEW_SIDE large with each found face's box (numbered, largest first),
    the chosen face's in yellow, and a first clicked corner of a box being drawn."""
    img = photo.image.copy()
    s = min(1.0, VIEW_SIDE / max(img.size))
    if s < 1:
        img = img.resize((max(1, round(img.width * s)), max(1, round(img.height * s))), Image.Resampling.BOX)
    d = ImageDraw.Draw(img)
    width = max(1, round(max(img.size) / 250))
    for i, f in enumerate(photo.faces):
        l, t, r_, b = (v * s for v in f.box)
        d.rectangle((l, t, r_, b), outline=(0, 255, 0), width=width)
        d.text((l + 2, t + 1), str(i + 1), fill=(0, 255, 0))
    if chosen is not None and chosen.how != "centre square":
        l, t, r_, b = (v * s for v in chosen.box)
        d.rectangle((l, t, r_, b), outline=(255, 220, 0), width=width)
    if corner is not None:
        x, y = corner[0] * s * photo.image.width / photo.size[0], corner[1] * s * photo.image.width / photo.size[0]
        d.ellipse((x - 3 * width, y - 3 * width, x + 3 * width, y + 3 * width), outline=(255, 220, 0), width=width)
    return np.asarray(img)


def view_to_photo(photo: PhotoFaces, x: float, y: float) -> tuple[float, float]:
    """A point clicked on photo_view's image -> the photo's own pixels."""
    s = min(1.0, VIEW_SIDE / max(photo.image.size)) * photo.image.width / photo.size[0]
    return x / s, y / s


@dataclass
class PastedView:
    """The chosen face's result pasted back into its surroundings, and the same with bicubic."""
    model: np.ndarray  # the region with the 32x32 result pasted in
    bicubic: np.ndarray  # the same region with the 8x8 input's bicubic upscale pasted in
    label: str  # what they show, for the page
    info: dict  # the scale (faces.paste_plan) and its note, for the numbers


def pasted_view(p: Prepared, output: np.ndarray) -> PastedView | None:
    """The chosen face's surroundings (three times its crop) at the scale the model works at
    (sr_blockwise.faces.paste_plan: a face over 32 px, the region reduced so that the face is 8 px,
    then 4x; a smaller face, 4x, less to stay within PASTE_VIEW_SIDE), with the 32x32 result pasted
    back, and beside it the bicubic upscale of the same 8x8 pasted the same way: the difference
    is the model's."""
    from .. import faces as F
    from ..data import bicubic_upscale
    if p.chosen is None:
        return None
    img, f = p.photo.image, p.chosen
    cx, cy = F.apply(np.linalg.inv(f.matrix), [[16, 16]])[0]
    half = 1.5 * f.size
    box = [max(0, round(cx - half)), max(0, round(cy - half)),
           min(img.width, round(cx + half)), min(img.height, round(cy + half))]
    if box[2] <= box[0] or box[3] <= box[1]:
        box = [0, 0, img.width, img.height]
    region = img.crop(box)
    moved = F.Face(f.box, f.landmarks, f.score, f.matrix @ np.array([[1, 0, box[0]], [0, 1, box[1]], [0, 0, 1.0]]),
                   f.crop, f.lr, f.how)  # the same face, in the region's pixels
    r = p.photo.size[0] / img.width  # the photo's own pixels per pixel read (large photos are reduced)
    plan = F.paste_plan(region.size, [moved], own_size=(round(region.width * r), round(region.height * r)))
    scale = plan.scale if plan.face is not None else min(plan.scale, max(1.0, PASTE_VIEW_SIDE / max(region.size)))
    side = f.size * r  # in the photo's own pixels
    if plan.face is not None:
        label = f"Your photo at the size where this face is 8 px ({side:.0f} px -> 8), 4x"
    else:
        label = f"Your photo {scale:.3g}x (this face: {side:.0f} px, at most the output's 32)"
    if plan.small:
        label += f"; the face is under {F.SMALL_FACE} px there, too small to show much"
    return PastedView(F.paste_back(region, [moved], [output], scale),
                      F.paste_back(region, [moved], [bicubic_upscale(f.lr)], scale), label,
                      {"scale": round(scale, 5), "size": list(F.pasted_size(region.size, scale)),
                       "note": plan.note})


# ---------------------------------------------------------------- live decoding

@dataclass
class Frame:
    tokens: np.ndarray  # (3072,) decoded so far (positions >= done are not decoded yet)
    done: int
    block_map: np.ndarray  # (3072,) accepted block length per decoded token
    calls: int
    seconds: float


# The demo decodes in worker threads, where OpenMP teams outnumber the cores and libgomp stops
# spinning between parallel regions: there 2 torch threads ran several times slower than 1 (the
# native engine runs on 1 thread outside the main thread for the same reason, engine.py). So
# `sr-blockwise demo` sets 1 torch thread at start-up (--threads) for what runs in PyTorch
# (models the native engine does not run): torch.set_num_threads sets the calling thread's count
# and the count every thread started later begins with, so every worker gets it.
DECODE_THREADS = 1


def page_defaults(model) -> tuple[int, int, float]:
    """The page's starting k, eps and input guidance for this model: guidance 1 for weights
    without the learned input prior. The page decodes exact and approximate mode at one k:
    approximate mode's default (at batch 1 exact mode is about as fast at 4 as at 2)."""
    from sr_blockwise.decoding import DEFAULT_K, default_prior_weight
    return min(DEFAULT_K["approx"], model.cfg.n_blockwise), 2, default_prior_weight(model)


class Cancelled(Exception):
    pass


def decode_live(model, lr, opts, progress_every: int = 8, min_interval: float = 0.25,
                time_limit: float | None = None):
    """Decode one 8x8 input in a worker thread; yield Frames (at most one per min_interval
    seconds, always the newest) and finally the DecodeResult. Closing the generator (the user
    left) or passing time_limit stops the worker at its next progress call."""
    from sr_blockwise.decoding import DecodeResult, decode

    q: queue.Queue = queue.Queue()
    stop = threading.Event()
    t0 = time.perf_counter()

    def progress(tokens, done, bmap, calls):
        if stop.is_set():
            raise Cancelled()
        q.put(Frame(tokens[0], int(done[0]), bmap[0], int(calls), time.perf_counter() - t0))

    def work():
        try:
            q.put(decode(model, lr[None], opts, progress=progress, progress_every=progress_every))
        except BaseException as e:  # handed to the consumer, which raises it
            q.put(e)

    threading.Thread(target=work, name="sr-blockwise-decode", daemon=True).start()
    last = 0.0
    try:
        while True:
            try:
                item = q.get(timeout=1.0)
            except queue.Empty:
                item = None
            while isinstance(item, Frame) and not q.empty():  # only the newest frame matters
                item = q.get_nowait()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, DecodeResult):
                yield item
                return
            if time_limit is not None and time.perf_counter() - t0 > time_limit:
                raise TimeoutError(f"decoding took more than {time_limit:.0f} s; the server is busy, "
                                   "try again later")
            if item is not None and time.perf_counter() - last >= min_interval:
                last = time.perf_counter()
                yield item
    finally:
        stop.set()


def partial_image(tokens: np.ndarray, done: int) -> np.ndarray:
    t = np.full(GREEDY_CALLS, FILL, np.uint8)
    t[:done] = tokens[:done]
    return from_tokens(t)


def block_map_image(block_map: np.ndarray, done: int, k: int) -> np.ndarray:
    """(3072,) accepted block lengths -> (32, 32, 3) colours: each pixel the mean over its decoded
    channels of (length - 1) / (k - 1) on viridis; undecoded pixels light grey."""
    x = (np.asarray(block_map, float) - 1) / max(1, k - 1)
    decoded = (np.arange(GREEDY_CALLS) < done).reshape(32, 32, 3)
    x = x.reshape(32, 32, 3)
    n = decoded.sum(-1)
    v = np.clip((x * decoded).sum(-1) / np.maximum(n, 1), 0, 1) * (len(VIRIDIS) - 1)
    i = np.minimum(v.astype(int), len(VIRIDIS) - 2)
    f = (v - i)[..., None]
    rgb = VIRIDIS[i] * (1 - f) + VIRIDIS[i + 1] * f
    rgb[n == 0] = FILL
    return np.round(rgb).astype(np.uint8)


# ---------------------------------------------------------------- stats

TITLES = {"exact": "Exact", "approx": "Approximate", "greedy": "Greedy", "sample": "Sample"}


def mode_label(mode: str, opts) -> str:
    if mode == "greedy":
        return "Greedy (k=1)"
    if mode == "exact":
        return f"Exact (k={opts.k})"
    if mode == "sample":
        how = "speculative, " if opts.k > 1 else ""
        return f"Sample ({how}k={opts.k}, T={opts.temperature:g}, seed {opts.seed})"
    return f"Approximate (k={opts.k}, eps={opts.eps})"


def running_markdown(mode: str, opts, fr: Frame) -> str:
    steps = max(1, fr.calls - 1)  # the first call only proposes; every later one accepts a block
    return (f"**{mode_label(mode, opts)}**: decoding... {fr.done:,} / {GREEDY_CALLS:,} intensities\n\n"
            f"model calls **{fr.calls:,}** " + ("(one per intensity) " if opts.k == 1 else
                                                 f"(greedy: 1 per intensity) → **{fr.done / fr.calls:.1f}x fewer** ")
            + f"so far · mean block **{fr.done / steps:.2f}** · **{fr.seconds:.2f} s**")


def result_stats(mode: str, opts, res) -> dict:
    st = res.stats[0]
    return {"mode": mode, "k": opts.k, "rule": opts.rule, "eps": opts.eps, "temperature": opts.temperature,
            "seed": opts.seed if opts.temperature else None, "calls": st.calls,
            "greedy_calls": GREEDY_CALLS, "speedup_calls": GREEDY_CALLS / st.calls,
            "mean_block": st.mean_block, "block_hist": st.block_hist, "seconds": st.seconds}


def final_markdown(mode: str, opts, s: dict) -> str:
    lines = [f"**{mode_label(mode, opts)}**: done",
             f"model calls **{s['calls']:,}** "
             + ("(one per intensity)" if opts.k == 1 else
                f"(greedy: {GREEDY_CALLS:,}) → **{s['speedup_calls']:.1f}x fewer**")
             + f" · mean block **{s['mean_block']:.2f}** · **{s['seconds']:.2f} s**"]
    if "speedup_wall" in s:
        lines.append(f"wall clock vs greedy run here: **{s['speedup_wall']:.1f}x** (one run each, while the page "
                     "draws frames: single runs vary widely; `sr-blockwise bench-decode` measures speed)")
    if "identical_to_greedy" in s:
        lines.append("identical to greedy: **" + ("yes" if s["identical_to_greedy"] else "no") + "**")
    if "differs_from_exact" in s:
        lines.append(f"differs from exact on {s['differs_from_exact']:,} of {GREEDY_CALLS:,} intensities "
                     f"(max |diff| {s['max_abs_diff_vs_exact']})")
    return "\n\n".join(lines)


def compare(stats: dict, images: dict) -> None:
    """Add cross-mode facts to the stats: approx vs exact, and wall-clock speedup where greedy ran."""
    if "approx" in images and "exact" in images:
        d = np.abs(images["approx"].astype(int) - images["exact"].astype(int))
        stats["approx"]["differs_from_exact"] = int((d > 0).sum())
        stats["approx"]["max_abs_diff_vs_exact"] = int(d.max())
    if "greedy" in images:
        for m in ("exact", "approx"):
            if m in stats:
                stats[m]["speedup_wall"] = stats["greedy"]["seconds"] / max(stats[m]["seconds"], 1e-9)
        if "exact" in images:
            stats["exact"]["identical_to_greedy"] = bool((images["exact"] == images["greedy"]).all())
