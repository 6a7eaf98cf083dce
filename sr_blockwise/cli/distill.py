"""`sr-blockwise distill`: a model's greedy outputs on training faces, targets for `train --distill`."""
from __future__ import annotations

from pathlib import Path


def cmd_distill(a):
    """The base model's own greedy outputs on training faces: targets for distillation."""
    import numpy as np
    import torch
    from tqdm import tqdm

    from ..checkpoints import load_model
    from ..data import downsample_8, load_faces
    from ..decoding import DecodeOptions, decode

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


def register(sub):
    p = sub.add_parser("distill", help="greedy outputs of a model on training faces (for --distill)")
    p.add_argument("--weights", required=True)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--data", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--out", required=True)
    p.set_defaults(func=cmd_distill)
