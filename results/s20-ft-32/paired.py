# Paired per-face comparison, shipped cpu-finetuned vs s20-ft: greedy and eps=2 k=6 on the first
# N held-out test faces (batch 32, bf16, 2 threads); ST-LPIPS / SSIM / PSNR against the real face.
# Run in session 20 before shipping: 'shipped' was then session 17's weights (now in git history,
# commit 884ab92), /tmp/s20/w/cpu-finetuned.json the export of s20-ft (now weights/cpu-finetuned).
# Command: .venv/bin/python results/s20-ft-32/paired.py 96 (14 min).
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
models = {"shipped": "weights/cpu-finetuned.json", "s20": "/tmp/s20/w/cpu-finetuned.json"}
res = {}
for name, path in models.items():
    m = load_model(path)
    for mode in ("greedy", "approx"):
        out = np.concatenate([decode(m, lr[i:i + 32], options_for(mode, 6, 2)).images for i in range(0, N, 32)])
        res[name, mode] = {"stlpips": per(test, out), "ssim": ssim(test, out), "psnr": psnr(test, out)}
        print(name, mode, {k: round(float(v.mean()), 4) for k, v in res[name, mode].items()}, flush=True)
for mode in ("greedy", "approx"):
    for k in ("stlpips", "ssim", "psnr"):
        d = res["s20", mode][k] - res["shipped", mode][k]
        print(f"{mode:7s} {k:8s} s20 - shipped: mean {d.mean():+.4f}, std err {d.std(ddof=1) / np.sqrt(len(d)):.4f}, "
              f"s20 better on {int((d < 0).sum() if k == 'stlpips' else (d > 0).sum())}/{len(d)} faces")
