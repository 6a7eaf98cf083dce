# The engine with its bf16 products on the AMX tiles against the same engine with float32
# multiply-adds, in one process, rounds interleaved: call costs, seconds a face, and the outputs'
# quality (experiments/decode_ab.py). The multiply-add copy is packed as on a processor without
# AMX (engine.uses_amx False while it is packed); both copies run the same engine.cpp.
#   PYTHONPATH=. python experiments/amx-tiles/decode_speed.py [--threads 2]
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/decode_ab.py
from decode_ab import arguments, compare
from sr_blockwise.decoding import engine
from sr_blockwise.checkpoints import load_model

args = arguments()


def packed_model(tiles: bool):
    real = engine.uses_amx
    engine.uses_amx = lambda: tiles
    try:
        m = load_model("cpu-finetuned", dtype=torch.float32)
        engine.packed(m)
    finally:
        engine.uses_amx = real
    assert engine.packed(m).struct.layers[0].up_w.bf16 == (2 if tiles else 1)
    return m


compare({"multiply-adds": packed_model(False), "tiles": packed_model(True)}, "kernel",
        (("greedy", 1), ("exact", 2), ("approx", 2), ("approx", 6), ("exact", 6)), {1: 8, 16: 16}, args.rounds)
