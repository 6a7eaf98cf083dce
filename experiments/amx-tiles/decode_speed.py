# Seconds a face for the apps' settings at batch 1 and 16, on this tree's engine (run it with and without
# amx-engine.patch applied: PYTHONPATH=. python experiments/amx-tiles/decode_speed.py)
import time, numpy as np, torch, dataclasses
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import load_faces, downsample_8
from sr_blockwise.decoding import DecodeOptions, decode
torch.set_num_threads(2)
m = load_model("cpu-finetuned", dtype=torch.float32)
lr = downsample_8(load_faces(None).part("test").images[:16])
out = []
for B, n in ((1, 3), (16, 16)):
    for spec in ("greedy", "exact:k=2", "eps=2:k=2", "eps=2:k=6", "sample:k=4:T=0.8"):
        o = dataclasses.replace(DecodeOptions.parse(spec), prior_weight=2.0)
        t = time.perf_counter()
        for i in range(0, n, B):
            decode(m, lr[i:i + B], o)
        out.append(f"B{B} {spec} {(time.perf_counter() - t) / n:.3f}")
print(" | ".join(out))
