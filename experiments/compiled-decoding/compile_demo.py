# The demo's --compile (sr_blockwise.decoding.compile_for_decoding) against eager decoding, on the
# demo's own path: apps.demo.decode_live (worker thread, 1 torch thread), float32, batch 1, k=6,
# eps=2, input guidance 2. Face 0 of the held-out test split warms up (and compiles); faces 1-3 are
# timed. Checks, per face: exact == greedy, and compiled greedy == eager greedy.
#   .venv/bin/python experiments/compiled-decoding/compile_demo.py      (log: compile_demo.log, whose
#   table is this version's output; the first version's figures are noted below it)
# It runs on the code of commit 15a8b75, the last with compile_for_decoding (it went with the
# native engine): git worktree add ../compiled 15a8b75
import time, numpy as np, torch
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import compile_for_decoding
import sys; from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/paired.py
from paired import paper_options  # exact: exact-heads, approx: eps=2, as the logs decoded them
from apps.demo import decode_live

torch.set_num_threads(1)  # as `sr-blockwise demo` does (--threads): the decode workers begin with it
lr = downsample_8(load_faces(part="test").images[:4])
MODES = ("greedy", "exact", "approx")


def run(model, x, mode):
    *_, res = decode_live(model, x, paper_options(mode, 6, prior_weight=2.0))
    return res


m = load_model("cpu-finetuned", dtype=torch.float32)
out = {}
print("| decoder | face | greedy s | exact s (block) | approx s (block) | exact == greedy | greedy == eager greedy |")
print("|---|---|---|---|---|---|---|")
for tag in ("eager", "compiled"):
    if tag == "compiled":
        compile_for_decoding(m)
    t0 = time.perf_counter()
    for mode in MODES:
        run(m, lr[0], mode)
    print(f"| {tag} | 0 (warm-up) | all three modes: {time.perf_counter() - t0:.1f} s | | | | |", flush=True)
    for i in (1, 2, 3):
        r = out[tag, i] = {mode: run(m, lr[i], mode) for mode in MODES}
        same = np.array_equal(r["exact"].images, r["greedy"].images)
        vs_eager = np.array_equal(r["greedy"].images, out["eager", i]["greedy"].images)
        print(f"| {tag} | {i} | {r['greedy'].seconds:.2f} | {r['exact'].seconds:.2f} ({r['exact'].stats[0].mean_block:.2f}) | "
              f"{r['approx'].seconds:.2f} ({r['approx'].stats[0].mean_block:.2f}) | {same} | {vs_eager} |", flush=True)
for mode in MODES:
    e = np.mean([out["eager", i][mode].seconds for i in (1, 2, 3)])
    c = np.mean([out["compiled", i][mode].seconds for i in (1, 2, 3)])
    print(f"{mode}: eager {e:.2f} s, compiled {c:.2f} s, {e / c:.2f}x")
