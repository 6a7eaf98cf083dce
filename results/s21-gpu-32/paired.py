# Paired per-face comparison, shipped cpu-finetuned vs s21 (GPU warm-ft): greedy and eps=2 k=6 on the first
# N held-out test faces (batch 32, bf16, 2 threads); ST-LPIPS / SSIM / PSNR against the real face.
# Run in session 21 before shipping: 'shipped' was then session 20's weights (git history, commit
# 32f743b), results/s21-export/cpu-finetuned.json the export of the GPU run's warm-ft.
# Command: .venv/bin/python results/s21-gpu-32/paired.py 96
import sys, numpy as np, torch
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import load_faces, downsample_8
from sr_blockwise.decoding import decode, options_for
from sr_blockwise.metrics import Perceptual, psnr, ssim
torch.set_num_threads(2)
N = int(sys.argv[1])
test = load_faces(part="test").images[:N]
lr = downsample_8(test)
per = Perceptual("auto")
models = {"shipped": "weights/cpu-finetuned.json", "s21": "results/s21-export/cpu-finetuned.json"}
res = {}
for name, path in models.items():
    m = load_model(path)
    for mode in ("greedy", "approx"):
        out = np.concatenate([decode(m, lr[i:i + 32], options_for(mode, 6, 2)).images for i in range(0, N, 32)])
        res[name, mode] = {"stlpips": per(test, out), "ssim": ssim(test, out), "psnr": psnr(test, out)}
        print(name, mode, {k: round(float(v.mean()), 4) for k, v in res[name, mode].items()}, flush=True)
for mode in ("greedy", "approx"):
    for k in ("stlpips", "ssim", "psnr"):
        d = res["s21", mode][k] - res["shipped", mode][k]
        print(f"{mode:7s} {k:8s} s21 - shipped: mean {d.mean():+.4f}, std err {d.std(ddof=1) / np.sqrt(len(d)):.4f}, "
              f"s21 better on {int((d < 0).sum() if k == 'stlpips' else (d > 0).sum())}/{len(d)} faces")
