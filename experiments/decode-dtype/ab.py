"""Which weights dtype decodes faster here, bfloat16 or float32, and do their faces differ in quality?

The shipped weights loaded both ways (Upscaler dtype=...), decoded in the modes the batch command
runs (greedy; exact k=2 and approx k=4, the defaults), interleaved: --rounds rounds, each
decoding every (dtype, mode) once, so a burst of load elsewhere hits one round, not one dtype.
Seconds per face are medians over the rounds; quality is of the decoder's own outputs against
the real faces (held-out test faces).

    PYTHONPATH=. python experiments/decode-dtype/ab.py --rounds 4
"""
import argparse
import platform
import time

import numpy as np
import torch

from sr_blockwise.decoding import engine
from sr_blockwise.api import Upscaler
from sr_blockwise.data import DEFAULT_DATA, downsample_8, load_faces
from sr_blockwise.metrics import psnr, ssim

p = argparse.ArgumentParser()
p.add_argument("--weights", default="cpu-finetuned")
p.add_argument("--rounds", type=int, default=4)
p.add_argument("--faces", type=int, nargs=2, default=[8, 32], help="faces at batch 1 and at batch 16")
args = p.parse_args()

real = load_faces(DEFAULT_DATA / "celeba32.npz").part("test").images
name = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), platform.processor())
print(f"# {args.weights}; {name}; AMX tiles in use: {engine.uses_amx()}; {torch.get_num_threads()} threads; "
      f"torch {torch.__version__}\n")
ups = {dt: Upscaler(args.weights, device="cpu", dtype=dt) for dt in ("bfloat16", "float32")}
modes = [("greedy", None), ("exact", 2), ("approx", 4)]
print("| batch | mode, k | bfloat16 s/face | float32 s/face | bfloat16 / float32 | "
      "PSNR / SSIM bfloat16 | PSNR / SSIM float32 | faces identical |")
print("|---|---|---|---|---|---|---|---|")
for batch, n in zip((1, 16), args.faces):
    lr = downsample_8(real[:n])
    times = {(dt, m): [] for dt in ups for m in modes}
    outs = {}
    for _ in range(args.rounds):
        for (dt, m) in times:
            up, opts = ups[dt], ups[dt].options(m[0], k=m[1], guard=0)
            t = time.perf_counter()
            outs[dt, m] = np.concatenate([up.decode(lr[s:s + batch], opts)[0] for s in range(0, n, batch)])
            times[dt, m].append((time.perf_counter() - t) / n)
    for m in modes:
        b, f = (float(np.median(times[dt, m])) for dt in ups)
        q = {dt: (psnr(real[:n], outs[dt, m]).mean(), ssim(real[:n], outs[dt, m]).mean()) for dt in ups}
        same = sum(np.array_equal(x, y) for x, y in zip(outs["bfloat16", m], outs["float32", m]))
        print(f"| {batch} | {m[0]}{'' if m[1] is None else f', {m[1]}'} | {b:.3f} | {f:.3f} | {b / f:.2f}x | "
              f"{q['bfloat16'][0]:.2f} / {q['bfloat16'][1]:.3f} | {q['float32'][0]:.2f} / {q['float32'][1]:.3f} | "
              f"{same}/{n} |", flush=True)
print(f"\nseconds per face: median of {args.rounds} interleaved rounds; batch 16 runs {args.faces[1]} faces in "
      f"batches of 16")
