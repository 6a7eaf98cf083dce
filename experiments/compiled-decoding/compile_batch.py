# torch.compile with automatic dynamic shapes on the batch command's path: batch 8, fp32, 2 threads,
# the PyTorch engine (engine="torch"), the one torch.compile can compile
import time, sys, numpy as np, torch
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/paired.py
from paired import paper_options  # exact: exact-heads, approx: eps=2, as the logs decoded them
torch.set_num_threads(2)
from torch import _dynamo
_dynamo.config.recompile_limit = 64
B = 8
lr = downsample_8(load_faces(part="test").images[:3 * B])
warm, x = lr[:B], lr[B:]
m = load_model("cpu-finetuned", dtype=torch.float32)
res = {}
for tag in ("eager", "compiled"):
    if tag == "compiled":
        for name in ("step", "logits", "draft_heads"):
            setattr(m, name, torch.compile(getattr(m, name), dynamic=None))
    for mode in ("greedy", "approx"):
        t0 = time.perf_counter(); decode(m, warm, paper_options(mode, 6, prior_weight=2.0), engine="torch")
        w = time.perf_counter() - t0
        r = [decode(m, x[i * B:(i + 1) * B], paper_options(mode, 6, prior_weight=2.0), engine="torch") for i in range(2)]
        res[tag, mode] = r
        s = sum(q.seconds for q in r) / (2 * B)
        print(f"{tag} {mode}: warm-up batch {w:.1f} s; {s:.2f} s/image; block {np.mean([st.mean_block for q in r for st in q.stats]):.2f}", flush=True)
for mode in ("greedy", "approx"):
    e = sum(q.seconds for q in res["eager", mode]); c = sum(q.seconds for q in res["compiled", mode])
    same = all(np.array_equal(a.images, b.images) for a, b in zip(res["eager", mode], res["compiled", mode]))
    print(f"{mode}: compiled {e / c:.2f}x eager; identical output {same}")
