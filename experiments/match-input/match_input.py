# Does back-projection onto the 8x8 input (sr_blockwise.data.match_input) help? Greedy and eps=2
# k=6 outputs of the given weights on the first N held-out test faces (batch 32, bf16, 2 threads),
# plain and matched; ST-LPIPS / SSIM / PSNR against the real face, each difference MATCHED - PLAIN
# with its standard error over the faces, and the time match_input takes; bicubic's scores on the
# same faces; then the same for the demo's built-in non-CelebA faces (the README picture's 10).
#   .venv/bin/python experiments/match-input/match_input.py N [--weights W]
# N=96 with the shipped cpu-finetuned: match_input.log beside this script, 6 min.
import argparse, time, numpy as np, torch
import sys; from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/paired.py
from sr_blockwise.examples import builtin_examples, lfw_faces
from paired import MODES, decode_all, first_test_faces, print_differences, scores, show
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import bicubic_upscale, downsample_8, image_to_input, match_input
from sr_blockwise.metrics import Perceptual, psnr
p = argparse.ArgumentParser()
p.add_argument("n", type=int)
p.add_argument("--weights", default="weights/cpu-finetuned.json")
a = p.parse_args()
torch.set_num_threads(2)
test, lr = first_test_faces(a.n)
per = Perceptual("auto")
m = load_model(a.weights)
show("bicubic", scores(per, test, np.stack([bicubic_upscale(x) for x in lr])))
for mode in MODES:
    out = decode_all(m, lr, mode)
    t = time.perf_counter()
    matched = match_input(out, lr)
    ms = (time.perf_counter() - t) / a.n * 1e3
    res = {name: scores(per, test, x) for name, x in (("plain", out), ("matched", matched))}
    for name in res:
        show(f"{mode} {name}", res[name])
    print_differences(mode, res["matched"], res["plain"], "matched", "plain")
    print(f"{mode:7s} match_input: {ms:.2f} ms per image; consistency check: the 8x8 of the plain output is "
          f"{np.abs(downsample_8(out).astype(int) - lr).mean():.2f} levels off the input on average, "
          f"of the matched one {np.abs(downsample_8(matched).astype(int) - lr).mean():.2f}", flush=True)

# the built-in faces: sr_blockwise.examples.builtin_examples() less the 8x8 one, and LFW faces 10, 20, 30, 40
imgs = [e.image for e in builtin_examples() if "8x8" not in e.name] + lfw_faces((10, 20, 30, 40))
lr_b, real_b = map(np.stack, zip(*[image_to_input(im) for im in imgs]))
for mode in MODES:
    out = decode_all(m, lr_b, mode)
    plain, matched = per(real_b, out), per(real_b, match_input(out, lr_b))
    print(f"built-in faces ({len(lr_b)}), {mode}: ST-LPIPS plain {plain.mean():.4f}, matched {matched.mean():.4f}, "
          f"matched better on {int((matched < plain).sum())}/{len(lr_b)}; PSNR plain {psnr(real_b, out).mean():.2f}, "
          f"matched {psnr(real_b, match_input(out, lr_b)).mean():.2f}", flush=True)
