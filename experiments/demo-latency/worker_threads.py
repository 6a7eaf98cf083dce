"""Does the engine run fast on two OpenMP threads in a worker thread? It depends on the main thread.

    PYTHONPATH=. .venv/bin/python experiments/demo-latency/worker_threads.py              # main never ran a team
    PYTHONPATH=. .venv/bin/python experiments/demo-latency/worker_threads.py --main-team  # main decoded on 2 threads first

Decodes held-out test face 1 (exact with the heads' proposals alone, exact-heads, as the log
decoded it: paired.paper_options; k=2, guidance 2) in fresh worker threads one after another,
with the engine's thread rule overridden to 2 threads there, then two workers at once. libgomp
counts every thread pool in the process; once they outnumber the cores, its barriers stop
spinning and sleep.
"""
import argparse
import sys
import threading
import time
from pathlib import Path

import torch

from sr_blockwise.decoding import engine
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/paired.py
from paired import paper_options  # exact: exact-heads, as the log decoded it

ap = argparse.ArgumentParser()
ap.add_argument("--main-team", action="store_true", help="decode on the main thread with 2 threads first")
args = ap.parse_args()
torch.set_num_threads(2 if args.main_team else 1)
model = load_model("cpu-finetuned", dtype=torch.float32)
lr = downsample_8(load_faces(part="test").images[1:2])
opts = paper_options("exact", 2, prior_weight=2.0)
if args.main_team:
    decode(model, lr, opts)
engine.threads_for_this_thread = lambda: 2  # the rule under test: 2 threads in every thread


def run(label):
    t0 = time.perf_counter()
    decode(model, lr, opts)
    print(f"| {'main thread decoded on 2 threads' if args.main_team else 'main thread never ran a team'} "
          f"| {label} | {time.perf_counter() - t0:.2f} |", flush=True)


for i in range(3):
    w = threading.Thread(target=run, args=(f"worker {i + 1} of 3, alone",))
    w.start()
    w.join()
workers = [threading.Thread(target=run, args=("two workers at once",)) for _ in range(2)]
for w in workers:
    w.start()
for w in workers:
    w.join()
