# Two (or more) packings of the shipped model run by the same engine in one process, rounds
# interleaved: call costs, seconds a face, and the outputs' quality on held-out faces. Shared by
# experiments/amx-tiles/decode_speed.py (the products' kernels) and
# experiments/attention-on-tiles/decode_speed.py (attention's).
import argparse
import time

import numpy as np
import torch
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from sr_blockwise import bench
from sr_blockwise.decoding import engine
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode

from paired import paper_options  # exact: exact-heads, approx: eps=2, as the logs decoded them


def arguments() -> argparse.Namespace:
    """--threads (torch's, set here) and --rounds; refuses a processor without AMX tiles."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    assert engine.uses_amx(), "this processor (or its kernel) gives the engine no AMX tiles"
    return args


def compare(models: dict, label: str, modes, faces: dict, rounds: int) -> None:
    """models: name -> model (each packed as the comparison wants); label: what the names are
    (the tables' first column); modes: (mode, k) pairs; faces: batch size -> faces decoded at it
    (the first held-out faces); quality on 32 faces, greedy and eps=2 k=6."""
    hr = load_faces(part="test").images[:max(32, *faces.values())]
    lr = downsample_8(hr)
    cost, speed = {}, {}
    for _ in range(rounds):
        for name, m in models.items():
            for B, n_faces in faces.items():
                for n in (1, 2, 4, 7):
                    ms = bench.time_call(m, n, B, max(30, 400 // B)) * 1e3
                    cost[name, B, n] = min(cost.get((name, B, n), 1e9), ms)
                for mode, k in modes:
                    t = time.perf_counter()
                    for i in range(0, n_faces, B):
                        decode(m, lr[i:i + B], paper_options(mode, k, prior_weight=2.0))
                    s = (time.perf_counter() - t) / n_faces
                    speed[name, B, mode, k] = min(speed.get((name, B, mode, k), 1e9), s)

    print(f"# {bench.machine()}; shipped cpu-finetuned, input guidance 2; fastest of {rounds} rounds")
    print(f"\n## One call (ms; bench.time_call, verify only)\n| {label} | batch | 1 token | 2 | 4 | 7 | 7 vs 1 |\n|---|---|---|---|---|---|---|")
    for B in faces:
        for name in models:
            c = [cost[name, B, n] for n in (1, 2, 4, 7)]
            print(f"| {name} | {B} | " + " | ".join(f"{v:.3f}" for v in c) + f" | {c[3] / c[0]:.2f}x |")
    where = ", ".join(f"faces 0-{n - 1} at batch {B}" for B, n in faces.items())
    print(f"\n## Seconds a face ({where}); in brackets: against the same {label}'s greedy")
    print(f"| {label} | batch | " + " | ".join(f"{m} k={k}" for m, k in modes) + " |\n|---|---|" + "---|" * len(modes))
    for B in faces:
        for name in models:
            g = speed[name, B, "greedy", 1]
            print(f"| {name} | {B} | " + " | ".join(f"{speed[name, B, m, k]:.4f} ({g / speed[name, B, m, k]:.2f}x)" for m, k in modes) + " |")

    print("\n## Quality, 32 held-out faces, against the real face")
    print(f"| {label} | mode | PSNR | SSIM | mean block |\n|---|---|---|---|---|")
    out = {}
    for mode, k in (("greedy", 1), ("approx", 6)):
        for name, m in models.items():
            r = decode(m, lr[:32], paper_options(mode, k, prior_weight=2.0))
            out[name, mode] = r.images
            p = np.mean([peak_signal_noise_ratio(h, o, data_range=255) for h, o in zip(hr, r.images)])
            s = np.mean([structural_similarity(h, o, channel_axis=-1, data_range=255) for h, o in zip(hr, r.images)])
            print(f"| {name} | {mode} k={k} | {p:.2f} | {s:.4f} | {np.mean([st.mean_block for st in r.stats]):.3f} |")
    a_name, b_name = list(models)[:2]
    for mode in ("greedy", "approx"):
        a, b = out[a_name, mode], out[b_name, mode]
        print(f"\n{mode}: {np.mean(a == b):.1%} of intensities the same in both; the two outputs "
              f"{np.mean([peak_signal_noise_ratio(x, y, data_range=255) for x, y in zip(a, b)]):.1f} dB PSNR apart")
