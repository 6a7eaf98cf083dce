"""Where a call of the PyTorch engine (decoding.decode(..., engine="torch"), the model's
`step` on its KV cache) spends its time: torch.profiler over the first --calls calls of one
face's greedy decoding and of exact decoding at k=6 (which also drafts with the heads), shipped
`cpu-finetuned` at the default guidance, float32, batch 1, one thread. The decode stops at
its first progress report, after --calls calls: a decode's whole 3,072 are not needed.

    PYTHONPATH=. python experiments/decoding-engine/profile_torch.py --calls 200   # profile_torch.log
"""
import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from sr_blockwise.api import Upscaler
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode

p = argparse.ArgumentParser()
p.add_argument("--calls", type=int, default=200)
args = p.parse_args()
torch.set_num_threads(1)
up = Upscaler("cpu-finetuned", device="cpu", dtype="float32")
lr = downsample_8(load_faces(None).part("test").images[:1])


class Enough(Exception):
    pass


def run(opts, calls):
    """Decode until `calls` model calls have been made; returns (calls, seconds)."""
    seen = {}

    def progress(tokens, done, block_map, n_calls):  # called once, after `calls` calls
        seen["calls"] = n_calls
        raise Enough

    t0 = time.perf_counter()
    try:
        decode(up.model, lr, opts, progress=progress, progress_every=calls, engine="torch")
    except Enough:
        pass
    return seen["calls"], time.perf_counter() - t0


print(f"# torch {torch.__version__}, 1 thread, batch 1, float32, shipped cpu-finetuned\n")
for name, opts in (("greedy", up.options("greedy", guard=0)), ("exact, k=6", up.options("exact", k=6, guard=0))):
    run(opts, 20)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        calls, seconds = run(opts, args.calls)
    ops = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ops)
    n_ops = sum(e.count for e in ops if e.key.startswith("aten::"))
    print(f"## {name}: {seconds / calls * 1e3:.2f} ms a call under the profiler ({calls} calls), "
          f"{n_ops / calls:.0f} aten operations a call\n")
    print("| operation | share of self CPU time | calls per model call |")
    print("|---|---|---|")
    for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:10]:
        print(f"| `{e.key}` | {e.self_cpu_time_total / total:.0%} | {e.count / calls:.0f} |")
    print()
    calls, seconds = run(opts, args.calls)
    print(f"without the profiler: {seconds / calls * 1e3:.2f} ms a call\n")
