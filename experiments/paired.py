# Paired per-face comparison of two weights before shipping: greedy and eps=2 k=6 on the first N
# held-out test faces (batch 32, bf16, 2 threads, on the PyTorch engine, as its logs were made);
# ST-LPIPS / SSIM / PSNR against the real face, and each measure's difference NEW - OLD with its
# standard error over the faces.
#   .venv/bin/python experiments/paired.py N --old OLD.json --new NEW.json [--names OLD,NEW]
# 14 min at N=96. Its logs: experiments/gpu-finetuning/paired-*.log.
# experiments/match-input/match_input.py and experiments/input-guidance/*.py import its helpers
# (the same decodes, scores and differences).
import argparse, numpy as np, torch
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import load_faces, downsample_8
from sr_blockwise.decoding import DecodeOptions, decode
from sr_blockwise.metrics import Perceptual, psnr, ssim

MODES = ("greedy", "approx")  # approx: eps=2, k=6
MEASURES = ("stlpips", "stlpips_vgg", "ssim", "psnr")  # those a score dict may hold, in print order
LOWER_IS_BETTER = ("stlpips", "stlpips_vgg")


def paper_options(mode: str, k: int, prior_weight: float | None = None) -> DecodeOptions:
    """The modes as these experiments' logs decoded them, named as the logs name them: greedy,
    exact (the heads' proposals alone: exact-heads) and approx (eps=2: the heads' argmax, the
    paper's rule). The apps' exact mode recycles proposals and their approx mode proposes window
    centres (decoding.options_for): other decodes than these logs'."""
    spec = {"greedy": "greedy", "exact": f"exact-heads:k={k}", "approx": f"eps=2:k={k}"}[mode]
    return DecodeOptions.parse(spec if prior_weight is None else f"{spec}:w={prior_weight}")


def first_test_faces(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n held-out test faces and their 8x8 inputs."""
    test = load_faces(part="test").images[:n]
    return test, downsample_8(test)


def decode_all(model, lr: np.ndarray, mode: str) -> np.ndarray:
    """greedy, or eps=2 at k=6 (approx), in batches of 32, on the PyTorch engine (engine="torch"),
    which made the logs of its users (gpu-finetuning, match-input); the native engine rounds
    differently."""
    return np.concatenate([decode(model, lr[i:i + 32], paper_options(mode, 6), engine="torch").images
                           for i in range(0, len(lr), 32)])


def scores(per, real: np.ndarray, out: np.ndarray) -> dict:
    """Per-face ST-LPIPS, SSIM and PSNR against the real faces."""
    return {"stlpips": per(real, out), "ssim": ssim(real, out), "psnr": psnr(real, out)}


def show(label: str, res: dict) -> None:
    print(label, {k: round(float(v.mean()), 4) for k, v in res.items()}, flush=True)


def print_differences(mode: str, new: dict, old: dict, new_name: str, old_name: str) -> None:
    """Each measure's mean difference NEW - OLD, its standard error, and on how many faces NEW is better."""
    for k in (k for k in MEASURES if k in new):
        d = np.asarray(new[k]) - np.asarray(old[k])
        print(f"{mode:7s} {k:8s} {new_name} - {old_name}: mean {d.mean():+.4f}, std err {d.std(ddof=1) / np.sqrt(len(d)):.4f}, "
              f"{new_name} better on {int((d < 0).sum() if k in LOWER_IS_BETTER else (d > 0).sum())}/{len(d)} faces")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("n", type=int)
    p.add_argument("--old", default="weights/cpu-finetuned.json")
    p.add_argument("--new", required=True)
    p.add_argument("--names", default="old,new")
    a = p.parse_args()
    torch.set_num_threads(2)
    test, lr = first_test_faces(a.n)
    per = Perceptual("auto")
    old, new = a.names.split(",")
    res = {}
    for name, path in {old: a.old, new: a.new}.items():
        m = load_model(path)
        for mode in MODES:
            res[name, mode] = scores(per, test, decode_all(m, lr, mode))
            show(f"{name} {mode}", res[name, mode])
    for mode in MODES:
        print_differences(mode, res[new, mode], res[old, mode], new, old)


if __name__ == "__main__":
    main()
