"""Would a call width chosen from the blocks accepted nearby make exact mode pay on the native engine?

    PYTHONPATH=. .venv/bin/python experiments/adaptive-blocks/neighbours.py [--faces 16]

Exact mode's output is greedy's whatever width a call verifies, so any width rule is safe; the
question is speed. For 16 held-out faces (shipped cpu-finetuned, guidance 2) one teacher-forced
pass gives A(t), the tokens a k=10 call starting at position t would accept (decoding's
exact-mode replay). Each image is then walked with a width rule: a call at t verifies w tokens
and keeps min(A(t), w), priced at the measured cost of a w-token call (batch 1, this run). The
rules: a fixed width; the run accepted one row up (t - 96) or one pixel left (t - 3), as
measured by the replay (more than a decoder that verified fewer tokens there could know, so an
upper bound for such rules); and the oracle, each call exactly as wide as what it will accept.
"""
import argparse

import numpy as np
import torch

from sr_blockwise.bench import time_call
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode, options_for
from sr_blockwise.decoding.replay import _agreement_native

ap = argparse.ArgumentParser()
ap.add_argument("--faces", type=int, default=16)
args = ap.parse_args()
K, S = 10, 3072
model = load_model("cpu-finetuned", dtype=torch.float32)
base = time_call(model, 1, reps=300)
cost = np.array([1.0] + [time_call(model, w, reps=300) / base for w in range(2, K + 1)])
print("call cost vs 1 token (batch 1, %d threads): %s" % (torch.get_num_threads(),
      " ".join(f"{w}:{c:.2f}" for w, c in enumerate(cost, 1))))
lr = downsample_8(load_faces(part="test").images[:args.faces])
greedy = decode(model, lr, options_for("greedy", 1, prior_weight=2.0)).images
agree = _agreement_native(model, lr, greedy, [K], 2.0)[K]
runs = (agree.long().cumprod(-1).sum(-1) + 1).numpy()  # A(t)


def walk(width) -> float:
    """greedy's cost over the rule's cost for the same tokens: the speedup over greedy"""
    tokens = price = 0.0
    for r in runs:
        t = 0
        while t < S:
            w = int(min(width(r, t), K))
            a = min(r[t], w, S - t)
            tokens += a
            price += cost[w - 1]
            t += a
    return tokens / price


rules = {f"fixed width {w}": (lambda r, t, w=w: w) for w in (1, 2, 3, 6)}
for cap in (2, 3, 4, 6):
    rules[f"run one row up, at most {cap}"] = lambda r, t, cap=cap: min(cap, r[t - 96]) if t >= 96 else 1
    rules[f"smaller of the runs up and left, at most {cap}"] = (
        lambda r, t, cap=cap: min(cap, r[t - 96], r[t - 3]) if t >= 96 else 1)
rules["oracle: as wide as what it accepts"] = lambda r, t: r[t]
print(f"\n| width rule, exact mode, {args.faces} faces | speedup over greedy |\n|---|---|")
for name, rule in rules.items():
    print(f"| {name} | {walk(rule):.3f} |")
