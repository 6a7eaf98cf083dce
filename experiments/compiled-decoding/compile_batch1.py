# Batch-1 decoding time (the demo's case) by dtype, with and without torch.compile of the model's
# per-call step (model.step, inductor, static shapes), at input guidance 2: greedy, exact k=6 and
# eps=2 k=6 on one held-out test face after a warm-up face; checks exact == greedy within each
# setting. The PyTorch engine (engine="torch"), the one torch.compile can compile.
#   .venv/bin/python experiments/compiled-decoding/compile_batch1.py      (log: compile_batch1.log)
import time
import numpy as np, torch
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode
import sys; from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/paired.py
from paired import paper_options  # exact: exact-heads, approx: eps=2, as the logs decoded them

torch.set_num_threads(2)
lr = downsample_8(load_faces(part="test").images[:2])
print("| dtype | step | greedy s | exact k=6 s (block) | eps=2 k=6 s (block) | exact == greedy | first calls (compile) s |")
print("|---|---|---|---|---|---|---|")
for dt in (torch.bfloat16, torch.float32):
    for compiled in (False, True):
        m = load_model("cpu-finetuned", dtype=dt)
        if compiled:
            m.step = torch.compile(m.step, dynamic=False)
        t0 = time.perf_counter()
        for mode in ("greedy", "exact", "approx"):  # warm-up on face 0: compiles each call shape
            decode(m, lr[:1], paper_options(mode, 6, prior_weight=2.0), engine="torch")
        warm = time.perf_counter() - t0
        r = {mode: decode(m, lr[1:2], paper_options(mode, 6, prior_weight=2.0), engine="torch") for mode in ("greedy", "exact", "approx")}
        same = np.array_equal(r["exact"].images, r["greedy"].images)
        print(f"| {str(dt).split('.')[1]} | {'compiled' if compiled else 'eager'} | {r['greedy'].seconds:.2f} | "
              f"{r['exact'].seconds:.2f} ({r['exact'].stats[0].mean_block:.2f}) | {r['approx'].seconds:.2f} "
              f"({r['approx'].stats[0].mean_block:.2f}) | {same} | {warm:.0f} |", flush=True)
