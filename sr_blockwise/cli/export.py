"""`sr-blockwise export`: a training checkpoint -> shipped weights (weights/NAME.safetensors + .json)."""
from __future__ import annotations

import json
import time
from pathlib import Path


def cmd_export(a):
    """Training checkpoint -> shipped weights, with held-out scores in the config."""
    import torch

    from ..checkpoints import WEIGHTS_DIR, load_model, portable_path, read_checkpoint, save_weights
    from ..data import load_faces
    from ..train import CACHE_DIR, bits_per_dim

    if not a.name or Path(a.name).name != a.name or a.name in (".", ".."):
        raise ValueError(f"--name {a.name!r}: a file name, without folders (--out-dir says where)")
    out_dir = Path(a.out_dir or WEIGHTS_DIR)
    if (out_dir / f"{a.name}.json").exists() and not a.replace:
        raise FileExistsError(f"{out_dir / (a.name + '.json')} exists: choose another --name, or pass --replace")
    ck = Path(a.checkpoint)
    if ck.is_dir():  # a run's folder
        ck = ck / "last.pt"
    if not ck.exists():
        ck = CACHE_DIR / a.checkpoint / "last.pt"
        if not ck.exists():
            raise FileNotFoundError(f"no checkpoint at {a.checkpoint} and no run named so in {CACHE_DIR}")
    if ck.suffix != ".pt":
        raise ValueError(f"{ck}: export takes a training checkpoint (.pt) or a run name; "
                         "shipped weights (.json) are exported already")
    ckpt = read_checkpoint(ck)
    model = load_model(ck, dtype=torch.float32, for_inference=False).eval()
    faces = load_faces(a.data)
    test = faces.part("test").images[: a.eval_images]
    t0 = time.time()
    train_config = dict(ckpt.get("train_config", {}))  # weights saved otherwise have no training record
    for key in ("data", "distill", "init_from"):
        if isinstance(train_config.get(key), str):
            train_config[key] = portable_path(train_config[key])
    meta = {"description": a.description, "source_checkpoint": portable_path(ck), "steps": ckpt.get("step"),
            "train_config": train_config, "params": sum(p.numel() for p in model.parameters()),
            "test_bits_per_dim": bits_per_dim(model, test, bf16=True),
            "test_images_scored": int(len(test)), "exported": time.strftime("%Y-%m-%d %H:%M")}
    if a.meta:
        meta.update(json.loads(Path(a.meta).read_text()))
    out = save_weights(model, out_dir / a.name, meta)
    print(f"wrote {out} (test bits/dim {meta['test_bits_per_dim']:.4f} on {len(test)} faces, "
          f"{time.time() - t0:.0f}s)")
    return 0


def register(sub):
    p = sub.add_parser("export", help="a training checkpoint -> weights/NAME.safetensors + .json")
    p.add_argument("checkpoint", help="run name (in ~/.cache/sr-blockwise) or a .pt path")
    p.add_argument("--name", required=True)
    p.add_argument("--description", default="")
    p.add_argument("--data", default=None)
    p.add_argument("--eval-images", type=int, default=256)
    p.add_argument("--meta", default=None, help="JSON file of extra facts for the config")
    p.add_argument("--out-dir", default=None, help="default: the package's weights/ folder")
    p.add_argument("--replace", action="store_true", help="overwrite weights of the same name in --out-dir")
    p.set_defaults(func=cmd_export)
