"""What does the cell guard cost a decode? Exact (k=2) and approximate (eps-window=2, k=4) mode at
input guidance 2, without the guard and at guard 32, interleaved round by round on the same
held-out faces (float32, native engine, the process's threads); seconds a face, best of the
rounds, and guarded / unguarded.

    PYTHONPATH=. python experiments/cell-guard/speed.py --rounds 8   # speed.log
"""
import argparse
import time

import torch

from sr_blockwise.api import Upscaler
from sr_blockwise.bench import machine
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import DecodeOptions

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--guard", type=float, default=32)
args = p.parse_args()

lr = downsample_8(load_faces(None).part("test").images[:16])
up = Upscaler("cpu-finetuned", device="cpu", dtype="float32")
print(f"# {machine()}; {torch.get_num_threads()} threads; shipped cpu-finetuned, float32, native engine")
cells = [(mode, batch) for mode in ("exact:k=2:w=2", "eps-window=2:k=4:w=2") for batch in (1, 16)]
best = {}
for r in range(args.rounds):
    for mode, batch in cells:
        for g in (0, args.guard):
            opts = DecodeOptions.parse(f"{mode}:guard={g:g}")
            faces = lr[:2] if batch == 1 else lr  # batch 1: two faces one at a time
            t0 = time.perf_counter()
            for s in range(0, len(faces), batch):
                up.decode(faces[s:s + batch], opts)
            per = (time.perf_counter() - t0) / len(faces)
            best[mode, batch, g] = min(best.get((mode, batch, g), per), per)
print("| mode | batch | s a face, no guard | guard | guarded / unguarded |")
print("|---|---|---|---|---|")
for mode, batch in cells:
    a, b = best[mode, batch, 0], best[mode, batch, args.guard]
    print(f"| {mode} | {batch} | {a:.3f} | {b:.3f} | {b / a:.2f}x |")
