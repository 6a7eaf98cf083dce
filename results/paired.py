# Paired per-face comparison of two weights before shipping: greedy and eps=2 k=6 on the first N
# held-out test faces (batch 32, bf16, 2 threads); ST-LPIPS / SSIM / PSNR against the real face,
# and each measure's difference NEW - OLD with its standard error over the faces.
#   .venv/bin/python results/paired.py N --old OLD.json --new NEW.json [--names OLD,NEW]
# Session 20: --old (session 17's) weights/cpu-finetuned.json --new the export of s20-ft
# --names shipped,s20 (results/s20-ft-32/paired.log); session 21: --old (session 20's)
# weights/cpu-finetuned.json --new results/s21-export/cpu-finetuned.json --names shipped,s21
# (results/s21-gpu-32/paired.log). 14 min at N=96. Earlier weights: git history (git show).
import argparse, numpy as np, torch
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import load_faces, downsample_8
from sr_blockwise.decoding import decode, options_for
from sr_blockwise.metrics import Perceptual, psnr, ssim
p = argparse.ArgumentParser()
p.add_argument("n", type=int)
p.add_argument("--old", default="weights/cpu-finetuned.json")
p.add_argument("--new", required=True)
p.add_argument("--names", default="old,new")
a = p.parse_args()
torch.set_num_threads(2)
test = load_faces(part="test").images[:a.n]
lr = downsample_8(test)
per = Perceptual("auto")
old, new = a.names.split(",")
res = {}
for name, path in {old: a.old, new: a.new}.items():
    m = load_model(path)
    for mode in ("greedy", "approx"):
        out = np.concatenate([decode(m, lr[i:i + 32], options_for(mode, 6, 2)).images for i in range(0, a.n, 32)])
        res[name, mode] = {"stlpips": per(test, out), "ssim": ssim(test, out), "psnr": psnr(test, out)}
        print(name, mode, {k: round(float(v.mean()), 4) for k, v in res[name, mode].items()}, flush=True)
for mode in ("greedy", "approx"):
    for k in ("stlpips", "ssim", "psnr"):
        d = res[new, mode][k] - res[old, mode][k]
        print(f"{mode:7s} {k:8s} {new} - {old}: mean {d.mean():+.4f}, std err {d.std(ddof=1) / np.sqrt(len(d)):.4f}, "
              f"{new} better on {int((d < 0).sum() if k == 'stlpips' else (d > 0).sum())}/{len(d)} faces")
