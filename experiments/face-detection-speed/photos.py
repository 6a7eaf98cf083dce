"""Test photos for face detection timing and quality, built from real photos (nothing downloaded):

- scene(w, h): a w x h photo of real content (skimage's coffee, chelsea, rocket and hubble photos,
  enlarged as a 2x2 mosaic: texture everywhere, as in a real photo, so the detector sees many
  face-like candidates) with the astronaut (w // 5 wide, as experiments/face-alignment's timing
  photos) and CelebA test-partition faces pasted at the given sides;
- portrait(w, h): the same background with the astronaut's photo h x h in the middle: one face
  about h / 6 wide, as in a portrait;
- crowd(w, h, sides): the same background with CelebA test-partition faces pasted at each side in
  `sides` (the paper's 138x138 crop of each photo, so the face is about 0.6 of the side), on a
  grid: the faces a few pixels wide that 8x8 -> 32x32 is for (`skip` picks other photos).

Each returns the photo and the pasted faces' boxes (left, top, right, bottom) of the paper's crop."""
import numpy as np
import skimage.data
from PIL import Image

from sr_blockwise.data import CELEBA_BOX, DEFAULT_DATA


def celeba_test_photos(n: int, skip: int = 0) -> list[Image.Image]:
    """n CelebA photos of the official test partition (every 5th from `skip`), as RGB."""
    root = DEFAULT_DATA / "celeba"
    partition = dict(line.split() for line in (root / "list_eval_partition.txt").read_text().splitlines() if line.strip())
    files = sorted(f for f in (root / "img_align_celeba").glob("*.jpg") if partition.get(f.name) == "2")
    return [Image.open(f).convert("RGB") for f in files[skip::5][:n]]


def background(w: int, h: int) -> Image.Image:
    parts = [skimage.data.coffee(), skimage.data.chelsea(), skimage.data.rocket(), skimage.data.hubble_deep_field()]
    canvas = Image.new("RGB", (w, h))
    for i, a in enumerate(parts):
        x, y = (i % 2) * (w // 2), (i // 2) * (h // 2)
        canvas.paste(Image.fromarray(a).resize((w - w // 2 if i % 2 else w // 2, h - h // 2 if i // 2 else h // 2),
                                               Image.Resampling.BICUBIC), (x, y))
    return canvas


def paste_faces(canvas: Image.Image, faces: list[Image.Image], sides, places) -> list[tuple]:
    boxes = []
    for face, side, (x, y) in zip(faces, sides, places):
        canvas.paste(face.crop(CELEBA_BOX).resize((side, side), Image.Resampling.BOX), (x, y))
        boxes.append((x, y, x + side, y + side))
    return boxes


def scene(w: int, h: int, sides=(120, 200, 320)) -> tuple[Image.Image, list[tuple]]:
    canvas = background(w, h)
    astro = Image.fromarray(skimage.data.astronaut()).resize((w // 5, w // 5), Image.Resampling.BICUBIC)
    canvas.paste(astro, (w // 3, h // 4))
    places = [(w // 12 + i * w // 4, h * 2 // 3) for i in range(len(sides))]
    boxes = paste_faces(canvas, celeba_test_photos(len(sides)), sides, places)
    return canvas, boxes


def portrait(w: int, h: int) -> Image.Image:
    canvas = background(w, h)
    canvas.paste(Image.fromarray(skimage.data.astronaut()).resize((h, h), Image.Resampling.BICUBIC), ((w - h) // 2, 0))
    return canvas


def crowd(w: int, h: int, sides, skip: int = 3) -> tuple[Image.Image, list[tuple]]:
    canvas = background(w, h)
    cols = int(np.ceil(np.sqrt(len(sides) * w / h)))
    rows = int(np.ceil(len(sides) / cols))
    rng = np.random.default_rng(0)
    places = []
    for i, side in enumerate(sides):
        cx, cy = (i % cols + 0.5) * w / cols, (i // cols + 0.5) * h / rows
        jx, jy = rng.uniform(-0.2, 0.2, 2) * (w / cols, h / rows)
        places.append((int(cx + jx - side / 2), int(cy + jy - side / 2)))
    return canvas, paste_faces(canvas, celeba_test_photos(len(sides), skip), sides, places)
