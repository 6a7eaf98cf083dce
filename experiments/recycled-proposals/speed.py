"""Exact mode with recycled proposals against the heads' alone (exact-heads), in one process,
rounds interleaved: seconds per face, speedup over greedy (its faster run), mean block, and
the outputs checked equal to greedy's.

    PYTHONPATH=. python experiments/recycled-proposals/speed.py --batch 1 --faces 4 --k 2,3,4,6
    PYTHONPATH=. python experiments/recycled-proposals/speed.py --batch 16 --faces 32 --k 2,4,6,10
"""
import argparse
import time

import numpy as np
import torch

from sr_blockwise import checkpoints
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import DEFAULT_PRIOR_WEIGHT, DecodeOptions, decode

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=1)
p.add_argument("--faces", type=int, default=4)
p.add_argument("--k", default="2,4,6")
p.add_argument("--rounds", type=int, default=2)
p.add_argument("--threads", type=int, default=2)
args = p.parse_args()
torch.set_num_threads(args.threads)
model = checkpoints.load_model("cpu-finetuned", dtype=torch.float32)
lr = downsample_8(load_faces(part="test").images[:args.faces])
w = DEFAULT_PRIOR_WEIGHT


def run(opts):
    t0, outs, calls = time.perf_counter(), [], 0
    for i in range(0, len(lr), args.batch):
        r = decode(model, lr[i:i + args.batch], opts)
        outs.append(r.images)
        calls += sum(s.calls for s in r.stats)
    return (time.perf_counter() - t0) / len(lr), np.concatenate(outs), calls / len(lr)


run(DecodeOptions(k=2, rule="oracle", prior_weight=w))  # warm-up
ks = [int(k) for k in args.k.split(",")]
greedy, rows = [], {}
for _ in range(args.rounds):
    s, ref, _ = run(DecodeOptions(k=1, prior_weight=w))
    greedy.append(s)
    for k in ks:
        for propose in ("recycle", "argmax"):
            s, out, calls = run(DecodeOptions(k=k, propose=propose, prior_weight=w))
            assert (out == ref).all(), (k, propose)  # exact mode: greedy's output
            rows.setdefault((k, propose), []).append((s, calls))
g = min(greedy)
print(f"cpu-finetuned, {args.faces} held-out faces, batch {args.batch}, {args.threads} threads, best of "
      f"{args.rounds} rounds; greedy {g:.3f} s a face\n")
print("| k | exact-heads: s/face (x greedy), block | exact (recycled): s/face (x greedy), block |\n|---|---|---|")
for k in ks:
    cells = []
    for propose in ("argmax", "recycle"):
        s = min(x[0] for x in rows[k, propose])
        cells.append(f"{s:.3f} ({g / s:.2f}x), {3072 / rows[k, propose][0][1]:.2f}")
    print(f"| {k} | {cells[0]} | {cells[1]} |")
