import time, sys, numpy as np, torch
from dataclasses import replace
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode, options_for
torch.set_num_threads(1)
lr = downsample_8(load_faces(part="test").images[:3])
m = load_model("cpu-finetuned", dtype=torch.float32)
decode(m, lr[:1], options_for("greedy", prior_weight=2.0))  # warm
g = [decode(m, lr[i:i+1], options_for("greedy", prior_weight=2.0)) for i in (1, 2)]
gs = np.mean([r.seconds for r in g]); print(f"greedy {gs:.2f} s", flush=True)
for mode in ("exact", "approx"):
    for k in (6, 10):
        for c in (0, 0.05, 0.1, 0.2, 0.3, 0.5):
            o = replace(options_for(mode, k, 2, prior_weight=2.0), min_confidence=c)
            rs = [decode(m, lr[i:i+1], o) for i in (1, 2)]
            s = np.mean([r.seconds for r in rs])
            same = all(np.array_equal(r.images, gg.images) for r, gg in zip(rs, g))
            print(f"{mode} k={k} conf>={c}: {s:.2f} s ({gs/s:.2f}x greedy) block {np.mean([r.stats[0].mean_block for r in rs]):.2f} width {np.mean([r.extra['mean_width'] for r in rs]):.2f} ==greedy {same}", flush=True)
