"""Decoding on a GPU with the static engine (sr_blockwise/decoding/static.py): what a call costs
by the candidates it verifies, and seconds per face and faces/s for greedy, chains, trees and the
oracle, with exact mode checked against greedy bit for bit. Prints tables and writes JSON.

    python gpu/bench_decode.py --data .gpu/test-faces.npz --out OUT

`--data` is an .npz of 32x32 faces (`gpu/pack.py test-faces` writes held-out ones); without it the
inputs are random 8x8 images (costs hold, block sizes do not). Every setting has a flag, so the
same script runs on a CPU with small settings (tests/test_gpu.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tree this script lives in

from sr_blockwise.bench import machine  # noqa: E402
from sr_blockwise.checkpoints import load_model  # noqa: E402
from sr_blockwise.data import downsample_8, load_faces, to_tokens  # noqa: E402
from sr_blockwise.decoding import DecodeOptions, decode  # noqa: E402
from sr_blockwise.decoding.static import StaticDecoder  # noqa: E402

MODES = "greedy,exact:k=2,exact-heads:k=6,eps=2:k=6,exact:k=10:tree=64,eps=2:k=10:tree=64,eps=2:k=10:tree=256,oracle:k=6"


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def call_cost(model, src, sizes, batches, reps, dev) -> list[dict]:
    """Seconds per step of StaticDecoder by batch and tree size (a tree of N candidates: N=1 is
    greedy), timed over `reps` steps after one untimed (capture and warm-up)."""
    rows = []
    for B in batches:
        for N in sizes:
            opts = DecodeOptions.parse(f"exact:k=10:tree={N}" if N > 1 else "greedy", prior_weight=2)
            d = StaticDecoder(model, B, opts)
            batch_src = src[torch.arange(B) % len(src)]
            d.load(batch_src)
            if d.capture:
                d._capture(batch_src)
            d.step()
            sync(dev)
            t0 = time.perf_counter()
            for _ in range(reps):
                d.step()
            sync(dev)
            rows.append({"batch": B, "candidates": N, "ms_per_call": 1e3 * (time.perf_counter() - t0) / reps,
                         "graph": d.graph is not None})
            del d
    base = {r["batch"]: r["ms_per_call"] for r in rows if r["candidates"] == 1}
    for r in rows:
        r["vs_one_token"] = r["ms_per_call"] / base[r["batch"]] if r["batch"] in base else None
    return rows


def decode_speed(model, lr, modes, batches, engine="auto") -> list[dict]:
    """s/face and faces/s for each mode and batch size (the second of two decodes: the first
    captures), with exact modes checked against greedy's output."""
    rows, greedy = [], {}
    for B in batches:
        for spec in modes:
            opts = DecodeOptions.parse(spec, prior_weight=2)
            x = lr[:B] if len(lr) >= B else lr[np.arange(B) % len(lr)]
            decode(model, x, opts, engine=engine)
            r = decode(model, x, opts, engine=engine)
            if spec == "greedy":
                greedy[B] = r.images
            blocks = float(np.mean([s.mean_block for s in r.stats]))
            rows.append({"batch": B, "mode": spec, "engine": r.extra["engine"], "graph": r.extra.get("graph"),
                         "s_per_face": r.seconds / B, "faces_per_s": B / r.seconds, "mean_block": blocks,
                         "same_as_greedy": bool(np.array_equal(r.images, greedy[B])) if B in greedy else None})
        g = next(r for r in rows if r["batch"] == B and r["mode"] == "greedy")
        for r in rows:
            if r["batch"] == B:
                r["speedup"] = g["s_per_face"] / r["s_per_face"]
    return rows


def table(rows, keys) -> str:
    def cell(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    return "\n".join([" | ".join(keys)] + [" | ".join(cell(r.get(k)) for k in keys) for r in rows])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", default="cpu-finetuned")
    p.add_argument("--data", default=None, help=".npz of 32x32 faces (default: random 8x8 inputs)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--faces", type=int, default=16, help="faces decoded at batch 1 per mode")
    p.add_argument("--batches", default="1,16,256", help="batch sizes of the call-cost table")
    p.add_argument("--decode-batches", default="1,256", help="batch sizes of the decode table")
    p.add_argument("--sizes", default="1,2,4,8,16,32,64,128,256", help="candidates per call in the call-cost table")
    p.add_argument("--modes", default=MODES, help="decode modes, comma-separated")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--engine", default="auto", help="decode's engine (auto: the static one on a GPU where it runs the mode)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(a.weights, device=a.device)
    if a.data:
        lr = np.stack([downsample_8(x) for x in load_faces(a.data).images])
    else:
        lr = np.random.default_rng(0).integers(0, 256, (max(a.faces, 1), 8, 8, 3), dtype=np.uint8)
    src = torch.from_numpy(to_tokens(lr)).to(dev)
    name = f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}" if dev.type == "cuda" else machine()
    print(f"device: {name}; {len(lr)} faces ({a.data or 'random inputs'})", flush=True)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    cost = call_cost(model, src, ints(a.sizes), ints(a.batches), a.reps, dev)
    print("\n" + table(cost, ["batch", "candidates", "ms_per_call", "vs_one_token", "graph"]), flush=True)
    batches = ints(a.decode_batches) if a.modes else []  # --modes "": the call costs alone
    speed = decode_speed(model, lr[:a.faces], a.modes.split(","), [b for b in batches if b == 1], a.engine)
    speed += decode_speed(model, lr, ["greedy"], [b for b in batches if b > 1], a.engine)
    print("\n" + table(speed, ["batch", "mode", "engine", "graph", "s_per_face", "faces_per_s", "mean_block",
                              "speedup", "same_as_greedy"]), flush=True)
    result = {"device": name, "torch": torch.__version__, "weights": a.weights, "faces": len(lr),
              "data": "held-out faces" if a.data else "random inputs", "call_cost": cost, "decode": speed}
    (out / "bench_decode.json").write_text(json.dumps(result, indent=1) + "\n")
    bad = [r for r in speed if r["same_as_greedy"] is False and DecodeOptions.parse(r["mode"]).is_exact]
    if bad:
        print(f"exact mode differs from greedy: {[r['mode'] for r in bad]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
