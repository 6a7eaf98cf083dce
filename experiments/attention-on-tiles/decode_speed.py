# The engine's attention on the AMX tiles against the same engine's attention with float32
# multiply-adds (both with every bf16 weight product on the tiles), in one process, rounds
# interleaved: call costs, seconds a face, and the outputs' quality. The multiply-add copy is the
# same packed model with its engine's kv_bf16 set to 1, as for heads whose width is no multiple of 32.
#   PYTHONPATH=. python experiments/attention-on-tiles/decode_speed.py [--threads 2] [--rounds 2]
import argparse
import time

import numpy as np
import torch
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from sr_blockwise import bench, engine
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode, options_for

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--rounds", type=int, default=2)
args = ap.parse_args()
torch.set_num_threads(args.threads)
assert engine.uses_amx(), "this processor (or its kernel) gives the engine no AMX tiles"


def packed_model(attention_on_tiles: bool):
    m = load_model("cpu-finetuned", dtype=torch.float32)
    w = engine.packed(m)
    assert w.struct.kv_bf16 == 2  # the shipped model's heads are 32 wide
    w.struct.kv_bf16 = 2 if attention_on_tiles else 1  # a Batch copies the struct: this copy's calls
    return m


models = {"multiply-adds": packed_model(False), "tiles": packed_model(True)}
hr = load_faces(part="test").images[:32]
lr = downsample_8(hr)
modes = (("greedy", 1), ("exact", 2), ("exact", 6), ("approx", 2), ("approx", 6))
cost, speed = {}, {}
for _ in range(args.rounds):
    for name, m in models.items():
        for B in (1, 16):
            for n in (1, 2, 4, 7):
                ms = bench.time_call(m, n, B, max(30, 400 // B)) * 1e3
                cost[name, B, n] = min(cost.get((name, B, n), 1e9), ms)
            faces = 8 if B == 1 else 32
            for mode, k in modes:
                t = time.perf_counter()
                for i in range(0, faces, B):
                    decode(m, lr[i:i + B], options_for(mode, k, 2, prior_weight=2.0))
                s = (time.perf_counter() - t) / faces
                speed[name, B, mode, k] = min(speed.get((name, B, mode, k), 1e9), s)

print(f"# {bench.machine()}; shipped cpu-finetuned, input guidance 2; fastest of {args.rounds} rounds")
print("\n## One call (ms; bench.time_call, verify only)\n| attention | batch | 1 token | 2 | 4 | 7 | 7 vs 1 |\n|---|---|---|---|---|---|---|")
for B in (1, 16):
    for name in models:
        c = [cost[name, B, n] for n in (1, 2, 4, 7)]
        print(f"| {name} | {B} | " + " | ".join(f"{v:.3f}" for v in c) + f" | {c[3] / c[0]:.2f}x |")
print("\n## Seconds a face (faces 0-7 at batch 1, 0-31 at batch 16); in brackets: against the same engine's greedy")
print("| attention | batch | " + " | ".join(f"{m} k={k}" for m, k in modes) + " |\n|---|---|" + "---|" * len(modes))
for B in (1, 16):
    for name in models:
        g = speed[name, B, "greedy", 1]
        print(f"| {name} | {B} | " + " | ".join(f"{speed[name, B, m, k]:.4f} ({g / speed[name, B, m, k]:.2f}x)" for m, k in modes) + " |")

print("\n## Quality, 32 held-out faces, against the real face")
print("| attention | mode | PSNR | SSIM | mean block |\n|---|---|---|---|---|")
out = {}
for mode, k in (("greedy", 1), ("approx", 6)):
    for name, m in models.items():
        r = decode(m, lr, options_for(mode, k, 2, prior_weight=2.0))
        out[name, mode] = r.images
        p = np.mean([peak_signal_noise_ratio(h, o, data_range=255) for h, o in zip(hr, r.images)])
        s = np.mean([structural_similarity(h, o, channel_axis=-1, data_range=255) for h, o in zip(hr, r.images)])
        print(f"| {name} | {mode} k={k} | {p:.2f} | {s:.4f} | {np.mean([st.mean_block for st in r.stats]):.3f} |")
for mode in ("greedy", "approx"):
    a, b = out["multiply-adds", mode], out["tiles", mode]
    print(f"\n{mode}: {np.mean(a == b):.1%} of intensities the same in both; the two outputs "
          f"{np.mean([peak_signal_noise_ratio(x, y, data_range=255) for x, y in zip(a, b)]):.1f} dB PSNR apart")
