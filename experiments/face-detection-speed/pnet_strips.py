"""P-Net over each scale in one pass (faces.pnet_proposals) or in strips of output rows (as
variants.py's pnet_in_strips; patched in here): the same faces, and how long detect + align takes
each way on time_stages.py's photos (12 and 48 MP scenes, a 12 MP portrait), every face and the
largest only. The ways run interleaved, --repeats times each, on --threads threads (2: as the
front ends decode); the median is printed. Also P-Net alone over the 12 MP scene's pyramid at
several strip heights, and its maps' largest difference from one pass.

    PYTHONPATH=. python experiments/face-detection-speed/pnet_strips.py --repeats 7
"""
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from photos import portrait, scene
from sr_blockwise import faces as F
from sr_blockwise.data import open_rgb

p = argparse.ArgumentParser()
p.add_argument("--repeats", type=int, default=7)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--rows", type=int, nargs="*", default=[32, 64, 128, 256], help="strip heights for P-Net alone")
args = p.parse_args()
torch.set_num_threads(args.threads)
ONE_PASS = 10 ** 9  # a strip taller than any scale: one pass
STRIP_ROWS = 128
ways = {"one pass (kept)": ONE_PASS, f"strips of {STRIP_ROWS}": STRIP_ROWS}
rows_now = [ONE_PASS]


def pnet_maps(level, rows):
    """P-Net's maps over a (3, h, w) scale in strips of `rows` output rows (its 12 px window moves
    2 px a step: output rows [r0, r1) read input rows [2 r0, 2 r1 + 10))."""
    out_rows = -(-(level.shape[1] - 2) // 2) - 4  # conv 3x3, max-pool 2 (rounding up), two convs 3x3
    outs = [F.detector().pnet(F.net_input(level[None, :, 2 * r0:2 * min(out_rows, r0 + rows) + 10]))
            for r0 in range(0, max(out_rows, 1), rows)]
    return tuple(torch.cat(o, 2) for o in zip(*outs))


def pnet_proposals(pyramid, scale):  # faces.pnet_proposals with the maps made in strips
    from facenet_pytorch.models.utils.detect_face import generateBoundingBox
    from torchvision.ops import nms
    reg, probs = pnet_maps(pyramid.level(scale), rows_now[0])
    boxes, _ = generateBoundingBox(reg, probs[:, 1], scale, F.THRESHOLDS[0])
    return boxes[nms(boxes[:, :4], boxes[:, 4], 0.5)]


F.pnet_proposals = pnet_proposals


def faces(img, largest_only, rows):
    rows_now[0] = rows
    t = time.perf_counter()
    found = F.find_faces(img, largest_only=largest_only)
    return time.perf_counter() - t, [(f.box, f.landmarks) for f in found]


print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), median of {args.repeats}\n")
print("| photo | faces | " + " | ".join(f"{w} s" for w in ways) + " | ratio | same faces |")
print("|---|---|" + "---|" * (len(ways) + 2))
tmp = Path(tempfile.mkdtemp())
for kind, w, h in (("scene", 4000, 3000), ("scene", 8000, 6000), ("portrait", 4000, 3000)):
    photo = scene(w, h)[0] if kind == "scene" else portrait(w, h)
    path = tmp / f"{kind}-{w}x{h}.jpg"
    photo.save(path, quality=90)
    img = open_rgb(path)  # as the front ends open it (a 48 MP photo is decoded reduced)
    path.unlink()
    for largest_only in (False, True):
        times = {way: [] for way in ways}
        found = {}
        for way, rows in ways.items():
            faces(img, largest_only, rows)  # warm-up
        for _ in range(args.repeats):
            for way, rows in ways.items():
                t, found[way] = faces(img, largest_only, rows)
                times[way].append(t)
        a, b = (found[way] for way in ways)
        same = len(a) == len(b) and all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))
        med = [float(np.median(times[way])) for way in ways]
        print(f"| {kind} {w}x{h} | {'largest only' if largest_only else 'every face'}: {len(b)} | "
              + " | ".join(f"{m:.3f}" for m in med) + f" | {med[0] / med[1]:.2f}x | {'yes' if same else 'NO'} |")  # ratio: one pass / strips

photo = scene(4000, 3000)[0]
pyramid = F.Pyramid(F.detect_copy(photo)[0])
levels = [pyramid.level(s) for s in pyramid.scales]
heights = {"one pass": ONE_PASS, **{f"strips of {r}": r for r in args.rows}}
with torch.inference_mode():
    whole = [pnet_maps(level, ONE_PASS) for level in levels]
    times = {name: [] for name in heights}
    diff = {}
    for _ in range(args.repeats):
        for name, rows in heights.items():
            t = time.perf_counter()
            maps = [pnet_maps(level, rows) for level in levels]
            times[name].append(time.perf_counter() - t)
            diff[name] = max((x - y).abs().max().item() for m, n in zip(maps, whole) for x, y in zip(m, n))
print(f"\nP-Net alone over the 12 MP scene's {len(levels)} scales (largest {tuple(levels[0].shape[1:])}), median s:\n")
print("| P-Net | s | largest difference from one pass |\n|---|---|---|")
for name in heights:
    print(f"| {name} | {np.median(times[name]):.4f} | {diff[name]:.1e} |")
