# upper bound of adaptive block length: each call exactly as wide as what it will accept
import numpy as np, torch
from dataclasses import replace
from sr_blockwise.checkpoints import load_model
from sr_blockwise.bench import time_call
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode, options_for
torch.set_num_threads(1)
m = load_model("cpu-finetuned", dtype=torch.float32)
base = time_call(m, 1, reps=40)
cost = {n: (time_call(m, n, reps=40) / base if n > 1 else 1.0) for n in range(1, 7)}
# a fixed-k call still drafts k heads: price the width-n call at the k=6 draft to be fair
cost6 = time_call(m, 6, reps=40) / base
print("call cost vs 1 token:", " ".join(f"{n}:{c:.2f}" for n, c in cost.items()))
lr = downsample_8(load_faces(part="test").images[1:3])
for mode in ("exact", "approx"):
    r = decode(m, lr, options_for(mode, 6, 2, prior_weight=2.0))
    h = np.sum([s.block_hist for s in r.stats], 0)
    toks = (h * np.arange(1, 7)).sum()
    fixed = h.sum() * cost6 / toks
    oracle = sum(h[n - 1] * cost[n] for n in range(1, 7)) / toks
    print(f"{mode} k=6: block {toks / h.sum():.2f}; greedy-call units per token: fixed width {fixed:.2f} "
          f"-> {1 / fixed:.2f}x greedy; oracle width {oracle:.2f} -> at most {1 / oracle:.2f}x greedy")
