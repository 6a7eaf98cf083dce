"""Built-in example faces for the demo and `sr-blockwise examples`. None of them is CelebA: the
project ships no CelebA pixels.

- scikit-image's sample portraits: the astronaut (Eileen Collins, NASA, public domain) and the
  cameraman (CC0), cropped to the face; the astronaut again as a ready-made 8x8 input.
- a few faces of scikit-image's LFW subset (25x25 greyscale), to show any size and greyscale work.
- if a CelebA data path is configured, a few of the project's held-out test faces (32x32): for
  those the real 32x32 is known and the demo shows it beside the output.

Examples are written as image files, so they go through exactly the path an upload takes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from .data import DEFAULT_DATA, image_to_input, load_faces

# Face boxes (left, top, side) found with skimage's LBP frontal-face cascade and grown 1.5x about
# their centre, which gives about the framing of the CelebA crop the model was trained on.
FACE_BOXES = {"astronaut": (163, 38, 145), "camera": (193, 110, 84)}
LFW_FACES = (0, 1, 2, 6)  # indices into skimage.data.lfw_subset(); the first 100 are faces


@dataclass
class Example:
    name: str  # file name: what the page shows as the uploaded file
    caption: str
    image: Image.Image


def _crop(img: Image.Image, box) -> Image.Image:
    left, top, side = box
    return img.crop((left, top, left + side, top + side))


def builtin_examples() -> list[Example]:
    import skimage.data

    astro = _crop(Image.fromarray(skimage.data.astronaut()), FACE_BOXES["astronaut"])
    camera = _crop(Image.fromarray(skimage.data.camera()), FACE_BOXES["camera"])
    lr, _ = image_to_input(astro)
    out = [Example("astronaut.png", "astronaut (skimage)", astro),
           Example("cameraman.png", "cameraman (skimage, greyscale)", camera),
           Example("astronaut-8x8.png", "an 8x8 input, used as is", Image.fromarray(lr))]
    for i, grey in zip(LFW_FACES, lfw_faces(LFW_FACES)):
        out.append(Example(f"lfw-{i}.png", f"LFW face {i} (25x25 grey)", grey))
    return out


def lfw_faces(indices) -> list[Image.Image]:
    """skimage.data.lfw_subset() faces at these indices, as 25x25 greyscale (mode L) images."""
    import skimage.data

    lfw = skimage.data.lfw_subset()  # (200, 25, 25) floats in 0..1
    return [Image.fromarray(np.round(lfw[i] * 255).astype(np.uint8)) for i in indices]


def celeba_examples(path: str | Path | None = None, n: int = 8) -> list[Example]:
    """n held-out CelebA faces, evenly spread over the test part; [] when no data is configured."""
    path = Path(path) if path is not None else DEFAULT_DATA / "celeba32.npz"
    if not path.exists():
        return []
    test = load_faces(path).part("test")
    picks = np.linspace(0, len(test) - 1, min(n, len(test))).round().astype(int)
    out = []
    for i in picks:
        cid = int(test.ids[i])
        label = f"celeba-{cid:06d}" if cid >= 0 else f"face-{i}"
        out.append(Example(f"{label}.png", f"CelebA held-out {label} (32x32)", Image.fromarray(test.images[i])))
    return out


def write_examples(examples: list[Example], directory: str | Path) -> list[str]:
    """Save each example as PNG into directory; returns the paths in order."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for ex in examples:
        p = directory / ex.name
        ex.image.save(p, format="PNG")
        paths.append(str(p))
    return paths
