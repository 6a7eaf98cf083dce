import time, sys, numpy as np, torch
from dataclasses import replace
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode, options_for
torch.set_num_threads(2)
B = int(sys.argv[1]); CS = [float(c) for c in sys.argv[3].split(",")]; MODES = sys.argv[2].split(",")
lr = downsample_8(load_faces(part="test").images[:B + 2])
m = load_model("cpu-finetuned", dtype=torch.bfloat16)
decode(m, lr[:2], options_for("exact", 6, prior_weight=2.0))  # warm
x = lr[2:]
g = decode(m, x, options_for("greedy", prior_weight=2.0))
print(f"batch {B} bf16: greedy {g.seconds/B:.2f} s/image", flush=True)
for mode in MODES:
    for c in CS:
        o = replace(options_for(mode, 6, 2, prior_weight=2.0), min_confidence=c)
        r = decode(m, x, o)
        print(f"{mode} k=6 conf>={c}: {r.seconds/B:.2f} s/image ({g.seconds/r.seconds:.2f}x greedy) block {np.mean([s.mean_block for s in r.stats]):.2f} width {r.extra['mean_width']:.2f} ==greedy {np.array_equal(r.images, g.images)}", flush=True)
