# Face-by-face differences between two rows of results/guidance.py's JSON (NEW - OLD, the mean
# with its standard error over the faces, and on how many faces NEW is better):
#   .venv/bin/python results/guidance_paired.py results/s23-guidance/guidance.json "w=2 greedy matched" "w=1 greedy matched"
import json, sys
import numpy as np

log = json.load(open(sys.argv[1]))
new, old = log[sys.argv[2]], log[sys.argv[3]]
for k, lower_better in (("stlpips", True), ("stlpips_vgg", True), ("ssim", False), ("psnr", False)):
    d = np.array(new[k]) - np.array(old[k])
    better = int((d < 0).sum() if lower_better else (d > 0).sum())
    print(f"{sys.argv[2]} - {sys.argv[3]}: {k:11s} mean {d.mean():+.4f} std err {d.std(ddof=1) / np.sqrt(len(d)):.4f}, "
          f"better on {better}/{len(d)} faces")
