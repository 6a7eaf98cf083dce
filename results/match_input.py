# Does back-projection onto the 8x8 input (sr_blockwise.data.match_input) help? Greedy and eps=2
# k=6 outputs of the given weights on the first N held-out test faces (batch 32, bf16, 2 threads),
# plain and matched; ST-LPIPS / SSIM / PSNR against the real face, each difference MATCHED - PLAIN
# with its standard error over the faces, and the time match_input takes; bicubic's scores on the
# same faces; then the same for the demo's built-in non-CelebA faces (the README picture's 10).
#   .venv/bin/python results/match_input.py N [--weights W]
# Session 22: N=96 with the shipped cpu-finetuned (results/s22-gpu-32/match_input.log), 6 min.
import argparse, time, numpy as np, skimage.data, torch
from PIL import Image
from apps.examples import builtin_examples
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import bicubic_upscale, downsample_8, image_to_input, load_faces, match_input
from sr_blockwise.decoding import decode, options_for
from sr_blockwise.metrics import Perceptual, psnr, ssim
p = argparse.ArgumentParser()
p.add_argument("n", type=int)
p.add_argument("--weights", default="weights/cpu-finetuned.json")
a = p.parse_args()
torch.set_num_threads(2)
test = load_faces(part="test").images[:a.n]
lr = downsample_8(test)
per = Perceptual("auto")
m = load_model(a.weights)
bic = np.stack([bicubic_upscale(x) for x in lr])
print("bicubic", {"stlpips": round(float(per(test, bic).mean()), 4), "ssim": round(float(ssim(test, bic).mean()), 4),
                  "psnr": round(float(psnr(test, bic).mean()), 4)}, flush=True)
for mode in ("greedy", "approx"):
    out = np.concatenate([decode(m, lr[i:i + 32], options_for(mode, 6, 2)).images for i in range(0, a.n, 32)])
    t = time.perf_counter()
    matched = match_input(out, lr)
    ms = (time.perf_counter() - t) / a.n * 1e3
    res = {}
    for name, x in (("plain", out), ("matched", matched)):
        res[name] = {"stlpips": per(test, x), "ssim": ssim(test, x), "psnr": psnr(test, x)}
        print(mode, name, {k: round(float(v.mean()), 4) for k, v in res[name].items()}, flush=True)
    for k in ("stlpips", "ssim", "psnr"):
        d = res["matched"][k] - res["plain"][k]
        print(f"{mode:7s} {k:8s} matched - plain: mean {d.mean():+.4f}, std err {d.std(ddof=1) / np.sqrt(len(d)):.4f}, "
              f"matched better on {int((d < 0).sum() if k == 'stlpips' else (d > 0).sum())}/{len(d)} faces")
    print(f"{mode:7s} match_input: {ms:.2f} ms per image; consistency check: the 8x8 of the plain output is "
          f"{np.abs(downsample_8(out).astype(int) - lr).mean():.2f} levels off the input on average, "
          f"of the matched one {np.abs(downsample_8(matched).astype(int) - lr).mean():.2f}", flush=True)

# the built-in faces: apps.examples.builtin_examples() less the 8x8 one, and LFW faces 10, 20, 30, 40
imgs = [e.image for e in builtin_examples() if "8x8" not in e.name]
lfw = skimage.data.lfw_subset()
imgs += [Image.fromarray(np.round(lfw[i] * 255).astype(np.uint8)) for i in (10, 20, 30, 40)]
lr_b, real_b = map(np.stack, zip(*[image_to_input(im) for im in imgs]))
for mode in ("greedy", "approx"):
    out = decode(m, lr_b, options_for(mode, 6, 2)).images
    plain, matched = per(real_b, out), per(real_b, match_input(out, lr_b))
    print(f"built-in faces ({len(lr_b)}), {mode}: ST-LPIPS plain {plain.mean():.4f}, matched {matched.mean():.4f}, "
          f"matched better on {int((matched < plain).sum())}/{len(lr_b)}; PSNR plain {psnr(real_b, out).mean():.2f}, "
          f"matched {psnr(real_b, match_input(out, lr_b)).mean():.2f}", flush=True)
