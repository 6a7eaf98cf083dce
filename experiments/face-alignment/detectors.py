"""Detection quality: MTCNN (facenet-pytorch, as sr_blockwise.faces runs it) against skimage's
LBP cascade (a simpler detector, no landmarks), on photos whose answer is known.

- LFW (skimage.data.lfw_subset): the first --lfw faces (found?) and the first --lfw of its 100
  non-faces (a detection there is a false positive);
- reframed: held-out CelebA test photos moved by a known random similarity into 256x256 photos
  (compare.py's reframing). The ideal crop is the paper's crop moved by the same similarity; the
  error of a framing is the mean distance of its crop's four corners from the ideal crop's, in
  pixels of the 32x32 crop. The cascade's framing: its box grown 1.5x into a square.

    PYTHONPATH=. python experiments/face-alignment/detectors.py --lfw 50 --reframed 24 [--factor 0.6]
"""
import argparse
import math
import time

import numpy as np
import skimage.data
from PIL import Image

from lbp_cascade import largest_box
from sr_blockwise import faces as F
from sr_blockwise.data import DEFAULT_DATA, open_rgb, part_mask

p = argparse.ArgumentParser()
p.add_argument("--lfw", type=int, default=50)
p.add_argument("--reframed", type=int, default=24)
p.add_argument("--factor", type=float, default=F.PYRAMID_FACTOR, help="MTCNN's pyramid step (faces.PYRAMID_FACTOR)")
args = p.parse_args()
F.PYRAMID_FACTOR = args.factor
rng = np.random.default_rng(0)
def lbp(img: Image.Image):
    """The largest LBP cascade box as (left, top, side), in the photo's pixels, or None."""
    box = largest_box(img)
    return None if box is None else box[:3]


def reframe(photo: Image.Image, size=256):
    """compare.py's reframing, also returning the (3, 3) map from photo points to new ones."""
    a = np.pad(np.asarray(photo), ((218, 218), (178, 178), (0, 0)), mode="symmetric")
    s = rng.uniform(0.45, 1.2) * size / 218
    th = math.radians(rng.uniform(-25, 25))
    cx, cy = 178 + 89, 218 + 109
    ox, oy = size / 2 + rng.uniform(-0.25, 0.25) * size, size / 2 + rng.uniform(-0.2, 0.2) * size
    c, si = math.cos(th) / s, math.sin(th) / s
    inv = np.array([[c, -si, cx - c * ox + si * oy], [si, c, cy - si * ox - c * oy], [0, 0, 1]])
    moved = Image.fromarray(a).transform((size, size), Image.Transform.AFFINE, tuple(inv[:2].ravel()),
                                         Image.Resampling.BICUBIC)
    # new point -> padded point -> photo point (the padding shifts by 178, 218)
    to_photo = np.array([[1, 0, -178], [0, 1, -218], [0, 0, 1.0]]) @ inv
    return moved, np.linalg.inv(to_photo)


def corner_error(matrix, ideal):
    corners = np.array([[0, 0], [32, 0], [0, 32], [32, 32]], float)
    # where each framing's crop corners lie in the photo, measured in the ideal crop's pixels
    return float(np.linalg.norm(F.apply(ideal @ np.linalg.inv(matrix), corners) - corners, axis=1).mean())


lfw = skimage.data.lfw_subset()
rows = {}
for name, idx in (("lfw faces", range(args.lfw)), ("lfw non-faces", range(100, 100 + args.lfw))):
    m = c = 0
    t_m = t_c = 0.0
    for i in idx:
        img = Image.fromarray(np.round(lfw[i] * 255).astype(np.uint8)).convert("RGB")
        t = time.perf_counter(); m += bool(F.detect(img)); t_m += time.perf_counter() - t
        t = time.perf_counter(); c += lbp(img) is not None; t_c += time.perf_counter() - t
    rows[name] = (m, c, len(idx), t_m / len(idx), t_c / len(idx))

root = DEFAULT_DATA / "celeba"
partition = dict(line.split() for line in (root / "list_eval_partition.txt").read_text().splitlines() if line.strip())
files = sorted((root / "img_align_celeba").glob("*.jpg"))
held = [f for f, k in zip(files, part_mask("test", np.array([int(f.stem) for f in files]),
                                             np.array([int(partition.get(f.name, -1)) for f in files]))) if k]
err_m, err_c, err_s, found_m, found_c, t_m, t_c = [], [], [], 0, 0, 0.0, 0.0
for f in held[: args.reframed]:
    photo = open_rgb(f)
    moved, to_new = reframe(photo)
    ideal = F.celeba_matrix() @ np.linalg.inv(to_new)  # new photo point -> ideal crop point
    t = time.perf_counter(); found = F.find_faces(moved); t_m += time.perf_counter() - t
    t = time.perf_counter(); box = lbp(moved); t_c += time.perf_counter() - t
    err_s.append(corner_error(F.square_matrix(moved.size), ideal))
    if found:
        found_m += 1
        err_m.append(min(corner_error(x.matrix, ideal) for x in found))  # mirrored copies are faces too
    if box is not None:
        found_c += 1
        l, tp, side = box
        cx, cy, sq = l + side / 2, tp + side / 2, 1.5 * side
        s = 32 / sq
        err_c.append(corner_error(np.array([[s, 0, -s * (cx - sq / 2)], [0, s, -s * (cy - sq / 2)], [0, 0, 1]]), ideal))
n = args.reframed
print("| photos | MTCNN found | LBP cascade found | MTCNN s a photo | cascade s a photo |")
print("|---|---|---|---|---|")
for name, (m, c, k, tm, tc) in rows.items():
    print(f"| {name} | {m}/{k} | {c}/{k} | {tm:.2f} | {tc:.2f} |")
print(f"| reframed CelebA (256x256) | {found_m}/{n} | {found_c}/{n} | {t_m / n:.2f} | {t_c / n:.2f} |")
print("\nframing error on reframed CelebA photos: mean distance of the crop's corners from the ideal "
      "crop's, in 32x32-crop pixels (median / mean / max over the photos where a face was found)")
for name, e in (("MTCNN, aligned (the best of its faces)", err_m), ("LBP cascade square", err_c),
                ("centre square", err_s)):
    e = np.array(e)
    print(f"  {name:40s} {np.median(e):5.2f} / {e.mean():5.2f} / {e.max():5.2f}  ({len(e)} photos)")
