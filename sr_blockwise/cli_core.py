"""Subcommands of the core library: prepare, weights, export, distill, bench-decode."""
from __future__ import annotations

import json
import time
from pathlib import Path


def cmd_prepare(a):
    from .data import load_faces, save_faces

    faces = load_faces(a.source, limit=a.limit, progress=not a.quiet)
    save_faces(faces, a.out)
    parts = {p: len(faces.part(p)) for p in ("train", "val", "test")}
    print(f"wrote {len(faces)} faces to {a.out} (split: {parts}); skipped {len(faces.skipped)}")
    for path, why in faces.skipped[:20]:
        print(f"  skipped {why}")
    if len(faces.skipped) > 20:
        print(f"  ... and {len(faces.skipped) - 20} more")
    return 0


def cmd_weights(a):
    from .checkpoints import WEIGHTS_DIR, list_weights

    ws = list_weights(Path(a.dir) if a.dir else WEIGHTS_DIR)
    if not ws:
        print(f"no weights in {a.dir or WEIGHTS_DIR}")
        return 1
    print(f"{'name':<16} {'K':>3} {'d':>4} {'params':>7}  {'test bits/dim':>13}  note")
    for w in ws:
        c, m = w["config"], w["meta"]
        bpd = m.get("test_bits_per_dim")
        print(f"{w['name']:<16} {c['n_blockwise']:>3} {c['d_model']:>4} {m.get('params', 0) / 1e6:>6.2f}M  "
              f"{bpd if bpd is None else format(bpd, '.4f'):>13}  {m.get('description', '')}")
    return 0


def portable_path(path) -> str | None:
    """A path as a weights card records it: relative to the current folder or to the home folder
    where it lies below one, else its last two parts (a card names no folder of the machine that
    made it)."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if not p.is_absolute():
        return str(path)
    for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/")):
        try:
            return prefix + str(p.relative_to(base))
        except ValueError:
            pass
    return str(Path(*p.parts[-2:]))


def cmd_export(a):
    """Training checkpoint -> shipped weights, with held-out scores in the config."""
    import torch

    from .checkpoints import WEIGHTS_DIR, load_model, save_weights
    from .data import load_faces
    from .train import CACHE_DIR, bits_per_dim

    ck = Path(a.checkpoint)
    if not ck.exists():
        ck = CACHE_DIR / a.checkpoint / "last.pt"
    ckpt = torch.load(ck, map_location="cpu", weights_only=True)
    model = load_model(ck, dtype=torch.float32, for_inference=False).eval()
    faces = load_faces(a.data)
    test = faces.part("test").images[: a.eval_images]
    t0 = time.time()
    train_config = dict(ckpt["train_config"])
    for key in ("data", "distill", "init_from"):
        if isinstance(train_config.get(key), str):
            train_config[key] = portable_path(train_config[key])
    meta = {"description": a.description, "source_checkpoint": portable_path(ck), "steps": ckpt["step"],
            "train_config": train_config, "params": sum(p.numel() for p in model.parameters()),
            "test_bits_per_dim": bits_per_dim(model, test, bf16=True),
            "test_images_scored": int(len(test)), "exported": time.strftime("%Y-%m-%d %H:%M")}
    if a.meta:
        meta.update(json.loads(Path(a.meta).read_text()))
    out = save_weights(model, Path(a.out_dir or WEIGHTS_DIR) / a.name, meta)
    print(f"wrote {out} (test bits/dim {meta['test_bits_per_dim']:.4f} on {len(test)} faces, "
          f"{time.time() - t0:.0f}s)")
    return 0


def cmd_distill(a):
    """The base model's own greedy outputs on training faces: targets for distillation."""
    import numpy as np
    import torch
    from tqdm import tqdm

    from .checkpoints import load_model
    from .data import downsample_8, load_faces
    from .decoding import DecodeOptions, decode

    model = load_model(a.weights, dtype=torch.bfloat16)
    train = load_faces(a.data).part("train")
    rng = np.random.default_rng(a.seed)
    idx = rng.permutation(len(train))[: a.n]
    lr = downsample_8(train.images[idx])
    out = Path(a.out)
    outs = []
    for i in tqdm(range(0, len(lr), a.batch_size), desc="greedy targets", unit="batch"):
        outs.append(decode(model, lr[i : i + a.batch_size], DecodeOptions(k=1)).images)
        # after every batch, atomically: a stopped run keeps the targets it has decoded so far
        n = sum(len(o) for o in outs)
        tmp = out.with_name(out.name + ".tmp.npz")
        np.savez_compressed(tmp, images=np.concatenate(outs), lr=lr[:n], train_index=idx[:n])
        tmp.replace(out)
    print(f"wrote {len(lr)} greedy targets to {out}")
    return 0


def cmd_bench(a):
    from .bench import run

    ks = [int(k) for k in a.k.split(",")]
    batches = [int(b) for b in a.batch_size.split(",")]
    run(a.weights, a.images, batches[0], a.reps, a.json, ks, a.data, a.prior_weight, a.dtype, batches,
        a.torch_images)
    return 0


def cmd_bench_train(a):
    from .bench import train_throughput

    r = train_throughput(a.preset, a.batch_size, a.steps, a.stage, a.head_frac)
    for k, v in r.items():
        print(f"{k:>26}: {v:.3f}" if isinstance(v, float) else f"{k:>26}: {v}")
    return 0


def cmd_learning_curve(a):
    """Train and held-out bits/dim against images seen, from the runs' log.csv files."""
    import csv

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .train import CACHE_DIR

    logs = [(run, batch, list(csv.DictReader(open(CACHE_DIR / run / "log.csv"))))
            for run, batch in zip(a.runs, a.batch_sizes or [8] * len(a.runs))]
    # heads-stage distillation runs log val_block (their base, so its bits/dim, cannot move)
    with_blocks = any(r.get("val_block") for _, _, rows in logs for r in rows)
    fig, axes = plt.subplots(1, 2 if with_blocks else 1, figsize=(13 if with_blocks else 9, 4), squeeze=False)
    ax = axes[0, 0]
    offset = 0
    for run, batch, rows in logs:
        steps = [int(r["step"]) * batch + offset for r in rows]
        train_bpd = [(s, float(r["bpd_train"])) for s, r in zip(steps, rows) if r["bpd_train"]]
        if train_bpd:
            ax.plot(*zip(*train_bpd), alpha=0.4, label=f"{run}: train batch")
        val = [(s, float(r["val_bpd"])) for s, r in zip(steps, rows) if r["val_bpd"]]
        if val:
            ax.plot(*zip(*val), "o-", label=f"{run}: validation")
        blocks = [(s, float(r["val_block"])) for s, r in zip(steps, rows) if r.get("val_block")]
        if blocks:
            axes[0, 1].plot(*zip(*blocks), "o-", label=run)
        offset = steps[-1]
    if with_blocks:
        axes[0, 1].set_xlabel("training images seen")
        axes[0, 1].set_ylabel("held-out exact block, k = n_blockwise")
        axes[0, 1].grid(alpha=0.3)
        axes[0, 1].legend(fontsize=8)
    ax.set_xlabel("training images seen")
    ax.set_ylabel("bits/dim (p1)")
    ax.set_ylim(top=8.2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: never over a curve
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")
    return 0


def register(sub):
    p = sub.add_parser("prepare", help="CelebA folder / photos / .npz -> a 32x32 array file")
    p.add_argument("source", help="CelebA folder (img_align_celeba/ + list_eval_partition.txt), "
                                  "a folder of photos, or an .npz")
    p.add_argument("-o", "--out", default="data/celeba32.npz")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("weights", help="list the shipped weights and their held-out scores")
    p.add_argument("--dir", default=None)
    p.set_defaults(func=cmd_weights)

    p = sub.add_parser("export", help="a training checkpoint -> weights/NAME.safetensors + .json")
    p.add_argument("checkpoint", help="run name (in ~/.cache/sr-blockwise) or a .pt path")
    p.add_argument("--name", required=True)
    p.add_argument("--description", default="")
    p.add_argument("--data", default=None)
    p.add_argument("--eval-images", type=int, default=256)
    p.add_argument("--meta", default=None, help="JSON file of extra facts for the config")
    p.add_argument("--out-dir", default=None)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("distill", help="greedy outputs of a model on training faces (for --distill)")
    p.add_argument("--weights", required=True)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--data", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--out", required=True)
    p.set_defaults(func=cmd_distill)

    p = sub.add_parser("bench-decode", help="cost per call vs tokens verified; seconds per face; images/s")
    p.add_argument("--weights", default=None, help="default: the cpu preset with random weights")
    p.add_argument("--images", type=int, default=4, help="faces per batch size (at least one batch)")
    p.add_argument("--batch-size", default="1,16,64", help="batch sizes, comma-separated")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--k", default="2,6,10")
    p.add_argument("--torch-images", type=int, default=1,
                   help="faces the torch engine decodes at batch 1 for comparison (0: skip; ~10 s each per mode)")
    p.add_argument("--data", default=None)
    p.add_argument("--json", default="results/bench_decode.json")
    p.add_argument("--prior-weight", type=float, default=None,
                   help="input guidance for every decode (default: the apps' default, 2, where the model "
                        "has the input prior; else 1)")
    p.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"],
                   help="dtype of the weights (the native engine computes in float32 either way)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("learning-curve", help="plot bits/dim from training runs' logs")
    p.add_argument("runs", nargs="+", help="run names in ~/.cache/sr-blockwise, in training order")
    p.add_argument("--batch-sizes", type=int, nargs="*", default=None)
    p.add_argument("-o", "--out", default="docs/learning-curve.png")
    p.set_defaults(func=cmd_learning_curve)

    p = sub.add_parser("bench-train", help="training images/s and the fraction of the bf16 matmul rate")
    p.add_argument("--preset", default="cpu")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    # (not the heads stage: it freezes the base, which this bench's step does not)
    p.add_argument("--stage", choices=["base", "finetune"], default="base")
    p.add_argument("--head-frac", type=float, default=0.1, help="positions the heads' loss is taken at")
    p.set_defaults(func=cmd_bench_train)
