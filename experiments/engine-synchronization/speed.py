"""How long a decoding call and a face take on the native engine of this tree: for comparing trees.

    PYTHONPATH=. .venv/bin/python experiments/engine-synchronization/speed.py [--label NAME]

Run from the root of each tree to compare (a `git worktree` of another commit), alternating
between them, on an otherwise idle machine. Prints the cost of one call (bench.time_call: the
smallest of 4 medians, batch 1 and 16, 1 to 7 tokens an image) and seconds per face (shipped
cpu-finetuned, guidance 2, held-out test faces, 2 threads) for greedy, exact k=2 (the heads'
proposals alone) and eps=2 (the heads' argmax) at k=2 and k=6, at batch 1 (8 faces), 8, 16 and 64.
"""
import argparse
import time

import torch

from sr_blockwise.bench import time_call
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import DecodeOptions, decode


def options(mode: str, k: int) -> DecodeOptions:
    """The log's modes on any tree: greedy, exact with the heads' proposals alone (exact-heads;
    a tree without that name has it as its exact) and eps=2 (the heads' argmax), guidance 2."""
    if mode == "exact":
        try:
            return DecodeOptions.parse(f"exact-heads:k={k}:w=2")
        except ValueError:
            return DecodeOptions.parse(f"exact:k={k}:w=2")
    return DecodeOptions.parse({"greedy": "greedy:w=2", "approx": f"eps=2:k={k}:w=2"}[mode])


ap = argparse.ArgumentParser()
ap.add_argument("--label", default="this tree")
args = ap.parse_args()
torch.set_num_threads(2)
model = load_model("cpu-finetuned", dtype=torch.float32)
tokens = (1, 2, 4, 7)
for B in (1, 16):
    ms = {n: min(time_call(model, n, B, max(30, 400 // B)) for _ in range(4)) * 1e3 for n in tokens}
    print(f"| {args.label} | call, batch {B} | " + " | ".join(f"{n} tokens {v:.3f} ms" for n, v in ms.items()) + " |")
faces = downsample_8(load_faces(part="test").images[:64])
decode(model, faces[:1], options("greedy", 1))  # the engine built and warm
for B, n in ((1, 8), (8, 16), (16, 16), (64, 64)):
    row = []
    for mode, k in (("greedy", 1), ("exact", 2), ("approx", 2), ("approx", 6)):
        t0 = time.perf_counter()
        for i in range(0, n, B):
            decode(model, faces[i:i + B], options(mode, k))
        row.append(f"{'eps=2' if mode == 'approx' else mode} k={k} {(time.perf_counter() - t0) / n:.4f}")
    print(f"| {args.label} | s/face, batch {B} | " + " | ".join(row) + " |", flush=True)
