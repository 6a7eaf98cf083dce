"""How close is evaluate's estimate of greedy decoding without a KV cache to the real thing?

`evaluate` times the no-cache decoder (decoding.greedy_uncached: every step re-runs the whole
prefix, rounded up to whole attention blocks) on a few tokens only and estimates the rest from
one timed step at each prefix length (evaluate.time_uncached_greedy). Here the tiny test model
(random weights; the shipped ones take minutes per token-block) decodes one face whole, and the
estimate from a 64-token prefix is made twice around it, on one thread.

    PYTHONPATH=. python experiments/uncached-estimate/check.py     # check.log
"""
import time

import numpy as np
import torch

from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import greedy
from sr_blockwise.evaluate import time_uncached_greedy
from sr_blockwise.model import ImageTransformerSR, preset

torch.set_num_threads(1)
torch.manual_seed(0)
model = ImageTransformerSR(preset("tiny")).for_inference(torch.float32)
lr = downsample_8(load_faces(None).part("test").images[:1])
cached = greedy(model, lr).images
print(f"# tiny preset, random weights, 1 face, 1 thread, torch {torch.__version__}\n")
runs = [("estimate from a 64-token prefix", 64), ("the whole decode, measured", 3072), ("estimate again", 64)]
out, work = {}, {}
for name, prefix in runs:
    t0 = time.perf_counter()
    out[name] = time_uncached_greedy(model, lr, cached, prefix_tokens=prefix)
    work[name] = time.perf_counter() - t0
print("| run | seconds | vs the whole decode | this run's own time |")
print("|---|---|---|---|")
whole = out["the whole decode, measured"]
for name, _ in runs:
    u = out[name]
    print(f"| {name} | {u['seconds_batch']:.1f} | {u['seconds_batch'] / whole['seconds_batch']:.2f} | {work[name]:.0f} s |")
for name in ("estimate from a 64-token prefix", "estimate again"):
    u = out[name]
    print(f"| {name}: the prefix extrapolated linearly | {u['linear_extrapolation_seconds_batch']:.1f} | "
          f"{u['linear_extrapolation_seconds_batch'] / whole['seconds_batch']:.2f} | |")
print(f"\nprefix_check (measured / predicted 64-token prefix): "
      f"{out['estimate from a 64-token prefix']['prefix_check']:.2f}, {out['estimate again']['prefix_check']:.2f}; "
      f"the whole decode's tokens equal the cached greedy decode's: "
      f"{whole['prefix_tokens_match_cached'] == 1.0}")
steps = whole["step_seconds_by_prefix"]
first, last = list(steps)[0], list(steps)[-1]
print(f"one step: {steps[first] * 1e3:.1f} ms at T={first}, {steps[last] * 1e3:.1f} ms at T={last} "
      f"({steps[last] / steps[first]:.1f}x for {int(last) // int(first)}x the tokens)")
