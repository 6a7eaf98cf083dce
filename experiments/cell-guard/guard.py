"""Does the cell guard (decoding.cell_guard) stop greedy decoding's collapses without costing
the faces that do not collapse?

The first N held-out test faces are decoded with the shipped cpu-finetuned weights at the apps'
input guidance (2), float32, on the native engine, in exact mode (identical to greedy), in
approximate mode (eps-window=2, k=4) and, with --sample-guards, in sample mode (k=4, seed
0, --temperature), without the guard and at each tolerance of --guards. A face
"collapses" where a 4x4 cell of the decoder's own output is more than 48 levels off its 8x8
input pixel in some channel (experiments/input-guidance/'s definition). Scores: outputs matched
to the input, as users get them, against the real 32x32 face; each guarded row's differences
from the unguarded one of its mode come with their standard error over the faces.

    PYTHONPATH=. python experiments/cell-guard/guard.py -n 1024 --guards 24 32 40 --approx-guards 32   # guard.log
    PYTHONPATH=. python experiments/cell-guard/guard.py -n 1024 --guards 32 --slopes 2 4 --approx-guards   # slope.log
    PYTHONPATH=. python experiments/cell-guard/guard.py -n 1024 --guards 32 --slopes 8 16 --approx-guards   # slope_steep.log (slope 8 only)
    PYTHONPATH=. python experiments/cell-guard/guard.py -n 1024 --guards --slopes 4 --approx-guards 32   # approx_slope4.log
    PYTHONPATH=. python experiments/cell-guard/guard.py -n 1024 --guards --slopes 4 --approx-guards --sample-guards 32   # sample.log
    PYTHONPATH=. python experiments/cell-guard/guard.py -n 1024 --guards --slopes 4 --approx-guards --sample-guards 32 --temperature 0.8   # sample_t08.log
"""
import argparse
import time

import numpy as np

from sr_blockwise.api import Upscaler
from sr_blockwise.data import downsample_8, load_faces, match_input
from sr_blockwise import decoding
from sr_blockwise.decoding import DecodeOptions
from sr_blockwise.metrics import Perceptual, psnr, ssim

p = argparse.ArgumentParser()
p.add_argument("-n", type=int, default=1024, help="held-out test faces (the first n)")
p.add_argument("--guards", type=float, nargs="*", default=[24, 32, 40])
p.add_argument("--approx-guards", type=float, nargs="*", default=[32])
p.add_argument("--sample-guards", type=float, nargs="*", default=[],
               help="tolerances for sample mode (k=4, seed 0: each guard's samples use the same noise; "
                    "an image's noise follows from its place in its batch of --batch-size, so faces a "
                    "batch apart share draws, which the with / without comparison does not mind)")
p.add_argument("--temperature", type=float, default=1.0, help="sample mode's (the batch command's default 1, the demo's 0.8)")
p.add_argument("--slopes", type=float, nargs="+", default=[1.0],
               help="the guard's slope (decoding.GUARD_SLOPE, nats a level), each guard at each")
p.add_argument("--collapse", type=int, default=48)
p.add_argument("--batch-size", type=int, default=64)
args = p.parse_args()

real = load_faces(None).part("test").images[: args.n]
lr = downsample_8(real)
up = Upscaler("cpu-finetuned", device="cpu", dtype="float32")
alex, vgg = Perceptual("stlpips"), Perceptual("stlpips-vgg")
MEASURES = ("alex", "vgg", "psnr", "ssim")


def run(spec, slope=1.0):
    decoding.GUARD_SLOPE = slope  # read by both engines at each decode
    opts = DecodeOptions.parse(spec)
    t0 = time.perf_counter()
    outs, blocks = [], []
    for s in range(0, len(lr), args.batch_size):
        images, stats = up.decode(lr[s:s + args.batch_size], opts)
        outs.append(images)
        blocks += [st.mean_block for st in stats]
    seconds = (time.perf_counter() - t0) / len(lr)
    outs = np.concatenate(outs)
    cells = outs.reshape(-1, 8, 4, 8, 4, 3).astype(float).mean(axis=(2, 4))
    dev = np.abs(cells - lr).max(axis=(1, 2, 3))
    m = match_input(outs, lr)
    scores = {"alex": alex(real, m), "vgg": vgg(real, m), "psnr": psnr(real, m), "ssim": ssim(real, m)}
    return {"spec": spec + (f" (slope {slope:g})" if "guard=" in spec else ""), "collapsed": dev > args.collapse, "scores": scores, "block": np.mean(blocks),
            "seconds": seconds}


def diff(a, b, k, idx):
    d = a["scores"][k][idx] - b["scores"][k][idx]
    return f"{d.mean():+.3f} ± {d.std(ddof=1) / np.sqrt(len(d)):.3f}"


print(f"# {args.n} held-out faces, shipped cpu-finetuned, float32, input guidance 2, native engine; "
      f"collapse: a cell > {args.collapse} levels off its input pixel; scores of outputs matched to the input")
print("| decoding | collapsed | alex | vgg | PSNR | SSIM | mean block | s a face (one run) | "
      "vs unguarded, all faces: alex / vgg / PSNR / SSIM | on the faces the unguarded mode collapsed on |")
print("|---|---|---|---|---|---|---|---|---|---|")
for mode, guards in (("exact:k=2:w=2", args.guards), ("eps-window=2:k=4:w=2", args.approx_guards),
                     (f"sample:k=4:w=2:T={args.temperature:g}", args.sample_guards)):
    if not guards:
        continue
    base = None
    for g, slope in [(0, 1.0)] + [(g, sl) for g in guards for sl in args.slopes]:
        r = run(mode + (f":guard={g:g}" if g else ""), slope)
        base = base or r
        every, bad = np.arange(args.n), np.flatnonzero(base["collapsed"])
        means = " | ".join(f"{r['scores'][k].mean():.3f}" if k != "psnr" else f"{r['scores'][k].mean():.2f}"
                           for k in MEASURES)
        vs = " / ".join(diff(r, base, k, every) for k in MEASURES) if g else ""
        vs_bad = (f"{r['collapsed'][bad].sum()} of {len(bad)} still collapsed; "
                  + " / ".join(diff(r, base, k, bad) for k in MEASURES)) if g else ""
        print(f"| {r['spec']} | {r['collapsed'].sum()} ({r['collapsed'].mean():.1%}) | {means} | {r['block']:.2f} | "
              f"{r['seconds']:.3f} | {vs} | {vs_bad} |", flush=True)
