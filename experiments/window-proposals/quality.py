"""Approximate mode's proposals: the heads' argmax (eps=E) against the centre of each head's most
probable (2E+1)-wide window (eps-window=E). Both accept a token within E levels of p1's argmax;
which gives the better faces, and the longer blocks? Shipped cpu-finetuned, input guidance 2 (the
apps'), the first N held-out faces, batch 16; ST-LPIPS (both trunks), SSIM and PSNR against the
real face, on the decoder's outputs and on them matched to the input (as the apps give them), with
each difference window - argmax, its standard error and on how many faces window is better.

    PYTHONPATH=. python experiments/window-proposals/quality.py 96 --k 2,4,6
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paired import first_test_faces, print_differences, show  # noqa: E402
from sr_blockwise.checkpoints import load_model  # noqa: E402
from sr_blockwise.data import match_input  # noqa: E402
from sr_blockwise.decoding import DEFAULT_PRIOR_WEIGHT, DecodeOptions, decode  # noqa: E402
from sr_blockwise.metrics import Perceptual, psnr, ssim  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("n", type=int)
p.add_argument("--k", default="2,4,6")
p.add_argument("--eps", type=int, default=2)
a = p.parse_args()
torch.set_num_threads(2)
real, lr = first_test_faces(a.n)
model = load_model("cpu-finetuned")
alex, vgg = Perceptual("stlpips"), Perceptual("stlpips-vgg")


def scores(out):
    return {"stlpips": alex(real, out), "stlpips_vgg": vgg(real, out), "ssim": ssim(real, out), "psnr": psnr(real, out)}


for k in (int(x) for x in a.k.split(",")):
    res, blocks = {}, {}
    for mode in (f"eps={a.eps}", f"eps-window={a.eps}"):
        opts = DecodeOptions.parse(f"{mode}:k={k}", prior_weight=DEFAULT_PRIOR_WEIGHT)
        runs = [decode(model, lr[i:i + 16], opts) for i in range(0, a.n, 16)]
        out = np.concatenate([r.images for r in runs])
        blocks[mode] = np.mean([s.mean_block for r in runs for s in r.stats])
        res[mode, "raw"], res[mode, "matched"] = scores(out), scores(match_input(out, lr))
        for kind in ("raw", "matched"):
            show(f"k={k} {mode} {kind} (mean block {blocks[mode]:.2f})", res[mode, kind])
    for kind in ("raw", "matched"):
        print_differences(f"k={k} {kind}", res[f"eps-window={a.eps}", kind], res[f"eps={a.eps}", kind], "window", "argmax")
    print()
