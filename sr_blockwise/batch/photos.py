"""Single images: a file's faces as the batch command decodes them, where they are pasted back,
the ground truth cropped as the input was, the compare strip and the quality of an output."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..data import BadImage, bicubic_upscale, enlarge, open_rgb, read_input
from ..metrics import psnr, ssim


@dataclass
class Photo:
    """An input file's faces, as the batch command decodes them."""
    image: Image.Image  # the photo as read (a large one at reduced size)
    faces: list  # faces.Face, largest first; an 8x8 / 32x32 input is one Face used as it is
    note: str  # what was found, e.g. "2 faces found" or "no face found ...: its centre square is used"
    warn: bool = False  # no face found: said on the terminal


def load_photo(path: Path, which: str = "largest", no_face: str = "centre") -> Photo:
    """A file -> its faces (sr_blockwise.faces.faces_of): 8x8 and 32x32 images as they are;
    --faces none the centre square (CelebA's crop for 178x218)."""
    from .. import faces as F
    img = open_rgb(path)
    found, note = F.faces_of(img, which, if_none=no_face)
    if found and found[0].as_is:
        return Photo(img, found, "as is")
    # a warning where no face was found (--faces none asked for the centre square)
    return Photo(img, found, note, warn=which != "none" and (not found or found[0].how == "centre square"))


def paste_plan_of(ph: Photo):
    """The scale a photo's faces are pasted back at (faces.paste_plan: the model's, where a face is
    larger than the 32x32 output) and the faces pasted; (None, []) for an 8x8 / 32x32 input, whose
    result is the whole photo. A photo where no face was found is pasted nothing: the centre square
    that stood in for its face file is no face of the photo."""
    if ph.faces and ph.faces[0].as_is:
        return None, []
    from ..faces import paste_plan
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
    from .. import faces as F
    return F.crop_like(open_rgb(path), face, input_size)


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
