"""Does the faster detection find the same faces? Crowd-like photos with many CelebA test-partition
faces pasted small (photos.crowd) and the timing photos (photos.scene), detected before (facenet-pytorch's
MTCNN.detect on the copy, as sr_blockwise.faces ran it) and now (sr_blockwise.faces.detect), now
with a coarser pyramid (--factors), and now with R-Net's and O-Net's crops made by PIL (uint8,
box filter: faster to make; --pil-crops). A pasted face counts as found where a detected box's
centre lies in the middle half of the pasted square (the paper's crop: the face is about 0.6 of
its side); a detection that is no pasted face (nor the astronaut) is a false positive. For faces
both find: the largest landmark distance between the two, as a fraction of the face box's side.
And --faces largest, whose search stops at the largest face: is it the whole search's largest?

    PYTHONPATH=. python experiments/face-detection-speed/quality.py --factors 0.709 0.6 --pil-crops
"""
import argparse
import time

import numpy as np
import torch
from facenet_pytorch import MTCNN
from PIL import Image

from photos import crowd, scene
from pil_crops import pil_crops
from sr_blockwise import faces as F

p = argparse.ArgumentParser()
p.add_argument("--factors", type=float, nargs="*", default=[F.PYRAMID_FACTOR])
p.add_argument("--pil-crops", action="store_true")
args = p.parse_args()
torch.set_num_threads(1)
before_mtcnn = MTCNN(keep_all=True, device="cpu", min_face_size=F.MIN_FACE, select_largest=True)


def before(img: Image.Image):
    """The detection as it was: facenet-pytorch's detect on a box-reduced copy."""
    scale = min(F.DETECT_MAX_SIDE, max(img.size)) / max(img.size)
    work = img if scale == 1 else img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.BOX)
    with torch.inference_mode():
        boxes, scores, marks = before_mtcnn.detect(work, landmarks=True)
    if boxes is None:
        return []
    sx, sy = img.width / work.width, img.height / work.height
    return [(np.asarray(b, float) * [sx, sy, sx, sy], float(s), np.asarray(m, float) * [sx, sy])
            for b, s, m in zip(boxes, scores, marks) if s >= F.MIN_SCORE]


def now(img: Image.Image, factor: float):
    F.PYRAMID_FACTOR = factor
    try:
        return F.detect(img)
    finally:
        F.PYRAMID_FACTOR = default_factor


def now_pil_crops(img: Image.Image):
    torch_crops, F.square_crops = F.square_crops, pil_crops
    try:
        return F.detect(img)
    finally:
        F.square_crops = torch_crops


def best_of(f, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def match(found, squares):
    """For each pasted square, the index of the detection whose centre lies in its middle half, or None."""
    out = []
    for l, t, r, b in squares:
        s = r - l
        hit = [i for i, (box, _, _) in enumerate(found)
               if abs((box[0] + box[2]) / 2 - (l + r) / 2) < s / 4 and abs((box[1] + box[3]) / 2 - (t + b) / 2) < s / 4]
        out.append(hit[0] if hit else None)
    return out


default_factor = F.PYRAMID_FACTOR
photos = [
    ("crowd 1600x1200, squares 16-64 px", *crowd(1600, 1200, [int(v) for v in np.linspace(16, 64, 49).round()])),
    ("crowd 4000x3000, squares 40-160 px", *crowd(4000, 3000, [int(v) for v in np.linspace(40, 160, 49).round()])),
    ("crowd 8000x6000, squares 80-320 px", *crowd(8000, 6000, [int(v) for v in np.linspace(80, 320, 49).round()])),
    ("crowd 1600x1200, squares 16-40 px", *crowd(1600, 1200, [int(v) for v in np.linspace(16, 40, 49).round()], skip=4)),
    ("crowd 4000x3000, squares 40-100 px", *crowd(4000, 3000, [int(v) for v in np.linspace(40, 100, 49).round()], skip=5)),
    ("scene 4000x3000", *scene(4000, 3000)),
    ("scene 2000x1500 (48 MP as opened)", *scene(2000, 1500, sides=(60, 100, 160))),
]
variants = ["before"] + [f"now, factor {f}" for f in args.factors] + ["now, PIL crops"] * args.pil_crops
print("| photo | pasted squares | " + " | ".join(variants) + " | false positives (" + ", ".join(variants) + ") |")
print("|---|---|" + "---|" * (len(variants) + 1))
worst = {v: [] for v in variants[1:]}
same_largest, times = [], []
by_side = []
for name, photo, squares in photos:
    if name.startswith("scene"):  # the astronaut is a face too, not a false positive
        w, h = photo.size
        k = (w // 5) / 512  # the astronaut's face: about (180, 62, 268, 174) of her 512x512 photo
        cx, cy, half = w // 3 + 224 * k, h // 4 + 118 * k, 50 * k
        squares = squares + [(cx - half, cy - half, cx + half, cy + half)]
    results = {"before": before(photo)}
    for f, v in zip(args.factors, variants[1:]):
        results[v] = now(photo, f)
    if args.pil_crops:
        results["now, PIL crops"] = now_pil_crops(photo)
    # --faces largest: the search stops at the largest face; is it the whole search's largest?
    # and what does it take (best of 3, one thread) against the whole search?
    first, alone = results[variants[1]][:1], F.detect(photo, largest_only=True)[:1]
    times.append((name, best_of(lambda: F.detect(photo)), best_of(lambda: F.detect(photo, largest_only=True)),
                  len(results[variants[1]]), len(F.detect(photo, largest_only=True))))
    same_largest.append(bool(first) == bool(alone) and (not first or np.abs(first[0][0] - alone[0][0]).max()
                                                        < 0.01 * (first[0][0][2] - first[0][0][0])))
    matched = {v: match(r, squares) for v, r in results.items()}
    found = {v: sum(m is not None for m in ms) for v, ms in matched.items()}
    false = {v: len(results[v]) - len({m for m in ms if m is not None}) for v, ms in matched.items()}
    print(f"| {name} | {len(squares)} | " + " | ".join(f"{found[v]}" for v in variants)
          + " | " + ", ".join(str(false[v]) for v in variants) + " |")
    for v in variants[1:]:
        for i, j in zip(matched["before"], matched[v]):
            if i is not None and j is not None:
                a, b = results["before"][i], results[v][j]
                side = a[0][2] - a[0][0]
                worst[v].append(float(np.abs(a[2] - b[2]).max() / side))
    if name.startswith("crowd"):
        sides = np.array([r - l for l, _, r, _ in squares])
        by_side.append((name, sides, {v: np.array([m is not None for m in ms]) for v, ms in matched.items()}))

print(f"\nlargest only (the search stopping at the largest face, --faces largest): the same largest face as "
      f"{variants[1]}'s, its box within 1% of its side, on {sum(same_largest)} of {len(same_largest)} photos")
print("\n| photo | detect, every face (s) | largest only (s) | faces found: every / largest only |\n|---|---|---|---|")
for name, t_all, t_largest, n_all, n_largest in times:
    print(f"| {name} | {t_all:.3f} | {t_largest:.3f} | {n_all} / {n_largest} |")
print("\nfaces found by the pasted square's side in the copy detected on (1600 px at most):\n")
print("| square side in the copy (px) | pasted | " + " | ".join(variants) + " |")
print("|---|---|" + "---|" * len(variants))
edges = [16, 24, 32, 40, 48, 56, 65]
for lo, hi in zip(edges[:-1], edges[1:]):
    n, f = 0, {v: 0 for v in variants}
    for name, sides, hits in by_side:
        photo_w = int(name.split()[1].split("x")[0])
        in_copy = sides * min(1.0, F.DETECT_MAX_SIDE / photo_w)
        sel = (in_copy >= lo) & (in_copy < hi)
        n += int(sel.sum())
        for v in variants:
            f[v] += int(hits[v][sel].sum())
    print(f"| {lo}-{hi - 1} | {n} | " + " | ".join(str(f[v]) for v in variants) + " |")

print("\nlandmarks, faces both find: largest distance from before's, as a fraction of the face box's side "
      "(median / max)")
for v, d in worst.items():
    print(f"  {v}: {np.median(d):.3f} / {np.max(d):.3f} over {len(d)} faces")
