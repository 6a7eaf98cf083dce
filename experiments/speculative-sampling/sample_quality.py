# How close sampled faces are to the real ones, beside greedy and bicubic: held-out test faces
# 0-31, shipped weights, guidance 2, outputs matched to their input (as upscale and the demo
# save them), batch 32, bf16; sampling by speculative sampling at k=4, seed 0.
#   .venv/bin/python experiments/speculative-sampling/sample_quality.py   (log: sample_quality.log)
import numpy as np, torch
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces, match_input
from sr_blockwise.decoding import DecodeOptions, decode
from sr_blockwise.metrics import Perceptual, bicubic_baseline, psnr, ssim

torch.set_num_threads(2)
real = load_faces(part="test").images[:32]
lr = downsample_8(real)
m = load_model("cpu-finetuned", dtype=torch.bfloat16)
percs = [Perceptual("auto"), Perceptual("stlpips-vgg")]
rows = {"bicubic": bicubic_baseline(lr)[0]}
for name, opts in (("greedy", DecodeOptions(k=1, prior_weight=2.0)),
                   ("sample T=1.0", DecodeOptions(k=4, temperature=1.0, prior_weight=2.0)),
                   ("sample T=0.8", DecodeOptions(k=4, temperature=0.8, prior_weight=2.0)),
                   ("sample T=0.6", DecodeOptions(k=4, temperature=0.6, prior_weight=2.0))):
    r = decode(m, lr, opts)
    rows[name] = match_input(r.images, lr)
    print(f"{name}: {r.seconds / 32:.2f} s/image", flush=True)
print(f"\n| output | PSNR | SSIM | {percs[0].label} | {percs[1].label} |\n|---|---|---|---|---|")
for name, x in rows.items():
    print(f"| {name} | {psnr(real, x).mean():.2f} | {ssim(real, x).mean():.3f} | "
          + " | ".join(f"{p(real, x).mean():.3f}" for p in percs) + " |")
