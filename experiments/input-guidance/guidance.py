# Input guidance (DecodeOptions.prior_weight) on the first N held-out test faces, shipped weights:
# greedy and eps=2 k=6 at each prior weight, raw and matched to the input (data.match_input),
# scored by both shift-tolerant LPIPS trunks (AlexNet, VGG), SSIM and PSNR, with the mean block,
# the decode time and how many faces collapsed somewhere (a 4x4 cell whose mean is > 48 levels
# off its input pixel in some channel); bicubic and nearest-neighbour as baselines.
#   .venv/bin/python experiments/input-guidance/guidance.py N --weights 1,1.5,2,3 [--json OUT.json]
# N=96: guidance.log and guidance.json beside this script. It decodes on the PyTorch engine
# (engine="torch"), as those logs did.
import argparse, json, time
import sys; from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/paired.py
import numpy as np, torch
from paired import first_test_faces, paper_options, scores
from sr_blockwise import metrics
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, match_input
from sr_blockwise.decoding import decode, pooled_block_hist


def collapsed(out: np.ndarray, lr: np.ndarray, levels: int = 48) -> np.ndarray:
    """Per face: does some 4x4 cell's mean sit more than `levels` off its input pixel (any channel)?"""
    return (np.abs(downsample_8(out).astype(int) - lr.astype(int)) > levels).any((1, 2, 3))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("n", type=int)
    p.add_argument("--weights", default="1,1.5,2,3")
    p.add_argument("--model", default="weights/cpu-finetuned.json")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.set_num_threads(2)
    real, lr = first_test_faces(a.n)
    alex, vgg = metrics.Perceptual("stlpips"), metrics.Perceptual("stlpips-vgg")
    log = {}

    def show(name, out, extra=""):
        s = scores(alex, real, out) | {"stlpips_vgg": vgg(real, out)}
        c = collapsed(out, lr)
        log[name] = {k: v.tolist() for k, v in s.items()} | {"collapsed": c.tolist()}
        print(f"{name:24s} ST-LPIPS alex {s['stlpips'].mean():.4f} vgg {s['stlpips_vgg'].mean():.4f}  "
              f"SSIM {s['ssim'].mean():.4f}  PSNR {s['psnr'].mean():.2f}  collapsed {c.sum()}/{a.n}"
              + extra, flush=True)

    show("bicubic", metrics.bicubic_baseline(lr)[0])
    show("nearest", metrics.nearest_baseline(lr)[0])
    model = load_model(a.model)
    for w in [float(x) for x in a.weights.split(",")]:
        for mode in ("greedy", "approx"):
            out, stats, t0 = [], [], time.perf_counter()
            for i in range(0, a.n, 32):
                r = decode(model, lr[i:i + 32], paper_options(mode, 6, prior_weight=w), engine="torch")
                out.append(r.images)
                stats += r.stats
            sec = (time.perf_counter() - t0) / a.n
            out = np.concatenate(out)
            label = f"w={w:g} {'greedy' if mode == 'greedy' else 'eps=2 k=6'}"
            show(label, out, f"  mean block {pooled_block_hist(stats)[1]:.2f}  {sec:.2f} s/face (batch 32)")
            show(label + " matched", match_input(out, lr))
            log[label]["mean_block"] = pooled_block_hist(stats)[1]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(log, f)


if __name__ == "__main__":
    main()
