"""The alignment template: where MTCNN's five landmarks (eyes, nose, mouth corners) and its face
box sit, on average, in the training framing (the paper's 138x138 crop of CelebA's aligned
178x218 photos, scaled to 32x32). Prints the constants kept in sr_blockwise/faces.py.

    python experiments/face-alignment/template.py [--n 600]
"""
import argparse
import time

import numpy as np
from PIL import Image

from sr_blockwise.data import CELEBA_BOX, DEFAULT_DATA, part_mask
from sr_blockwise.faces import detector

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=200, help="training-split photos to measure on")
args = p.parse_args()

root = DEFAULT_DATA / "celeba"
partition = dict(line.split() for line in (root / "list_eval_partition.txt").read_text().splitlines() if line.strip())
files = sorted((root / "img_align_celeba").glob("*.jpg"))
ids = np.array([int(f.stem) for f in files])
split = np.array([int(partition.get(f.name, -1)) for f in files])
train = [f for f, k in zip(files, part_mask("train", ids, split)) if k][: args.n]

left, top, right, _ = CELEBA_BOX
scale = 32 / (right - left)
marks, boxes, missed, t0 = [], [], 0, time.perf_counter()
for f in train:
    b, s, lm = detector().detect(Image.open(f).convert("RGB"), landmarks=True)
    if b is None:
        missed += 1
        continue
    i = int(np.argmax((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])))  # the largest face
    marks.append((np.asarray(lm[i], float) - [left, top]) * scale)
    boxes.append((np.asarray(b[i], float).reshape(2, 2) - [left, top]) * scale)
marks, boxes = np.array(marks), np.array(boxes)
print(f"{len(train)} training photos, face found in {len(marks)} ({missed} missed), "
      f"{(time.perf_counter() - t0) / len(train) * 1000:.0f} ms a photo")
print("landmarks in the 32x32 training crop (x, y), mean and spread (std):")
for name, m, sd in zip(["left eye", "right eye", "nose", "mouth left", "mouth right"], marks.mean(0), marks.std(0)):
    print(f"  {name:12s} {m[0]:6.2f} {m[1]:6.2f}   std {sd[0]:.2f} {sd[1]:.2f}")
print("TEMPLATE =", np.round(marks.mean(0), 2).tolist())
print("LANDMARK_WEIGHTS =", np.round(1 / (marks.std(0) ** 2).mean(1), 2).tolist(), " # 1 / variance")
print("TEMPLATE_BOX =", np.round(boxes.mean(0).reshape(-1), 2).tolist(), " # left, top, right, bottom")
