"""Approximate mode's speed with the heads' argmax proposals (eps=2) and with window proposals
(eps-window=2), at k = 2, 4, 6, against greedy in the same round: seconds a face and speedup,
shipped cpu-finetuned, input guidance 2, the first held-out faces (4 at batch 1, 16 at batch 16),
two rounds each.

    PYTHONPATH=. python experiments/window-proposals/speed.py
"""
import sys, time, numpy as np, torch
from sr_blockwise import checkpoints
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode, DecodeOptions
torch.set_num_threads(2)
m = checkpoints.load_model("cpu-finetuned", dtype=torch.float32)
lr = downsample_8(load_faces(part="test").images[:16])
decode(m, lr[:1], DecodeOptions(k=2, prior_weight=2.0))
for B, n in ((1, 4), (16, 16)):
  for rep in range(2):
    res = []
    for spec in ("greedy", "eps=2:k=2", "eps=2:k=4", "eps-window=2:k=2", "eps-window=2:k=4", "eps-window=2:k=6"):
        o = DecodeOptions.parse(spec, prior_weight=2.0)
        t0 = time.perf_counter()
        for i in range(0, n, B):
            decode(m, lr[i:i + B], o)
        res.append((spec, (time.perf_counter() - t0) / n))
    g = res[0][1]
    print(f"B{B} " + " | ".join(f"{s} {t:.4f} ({g / t:.2f}x)" for s, t in res), flush=True)
