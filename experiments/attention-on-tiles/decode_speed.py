# The engine's attention on the AMX tiles against the same engine's attention with float32
# multiply-adds (both with every bf16 weight product on the tiles), in one process, rounds
# interleaved: call costs, seconds a face, and the outputs' quality (experiments/decode_ab.py).
# The multiply-add copy is the same packed model with its engine's kv_bf16 set to 1, as for heads
# whose width is no multiple of 32.
#   PYTHONPATH=. python experiments/attention-on-tiles/decode_speed.py [--threads 2] [--rounds 2]
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/decode_ab.py
from decode_ab import arguments, compare
from sr_blockwise.decoding import engine
from sr_blockwise.checkpoints import load_model

args = arguments()


def packed_model(attention_on_tiles: bool):
    m = load_model("cpu-finetuned", dtype=torch.float32)
    w = engine.packed(m)
    assert w.struct.kv_bf16 == 2  # the shipped model's heads are 32 wide
    w.struct.kv_bf16 = 2 if attention_on_tiles else 1  # a Batch copies the struct: this copy's calls
    return m


compare({"multiply-adds": packed_model(False), "tiles": packed_model(True)}, "attention",
        (("greedy", 1), ("exact", 2), ("exact", 6), ("approx", 2), ("approx", 6)), {1: 8, 16: 32}, args.rounds)
