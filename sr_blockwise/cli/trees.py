"""`sr-blockwise trees`: measure the heads' rank accuracies that tree verification builds its trees
from (sr_blockwise/decoding/tree.py), print them and the trees' expected tokens per call, and
store them in the weights' card."""
from __future__ import annotations

import json

from ..api import dtype_name

DEFAULT_MODES = "exact,eps=2,eps-window=2"
DEFAULT_SIZES = "6,16,32,64,128,256"


def cmd_trees(a):
    import numpy as np
    import torch

    from ..checkpoints import load_model, resolve
    from ..data import downsample_8, load_faces
    from ..decoding import DecodeOptions, decode, default_prior_weight
    from ..decoding.tree import build_tree, expected_tokens, rank_accuracy

    sizes = [int(n) for n in a.sizes.split(",")]
    path = resolve(a.weights)
    if a.write and path.suffix != ".json":
        raise ValueError(f"--write stores the tables in a weights card (.json); {path.name} is a training checkpoint")
    model = load_model(path, dtype=getattr(torch, a.dtype))
    w = default_prior_weight(model) if a.prior_weight is None else a.prior_weight
    modes = [DecodeOptions.parse(m, k=model.cfg.n_blockwise, prior_weight=w) for m in a.modes.split(",")]
    faces = load_faces(a.data, part="val").images[:a.images]
    if not len(faces):
        raise ValueError(f"{a.data or 'the default data'}: no validation faces to measure on")
    lr = np.stack([downsample_8(x) for x in faces])
    greedy_images = decode(model, lr, DecodeOptions(prior_weight=w)).images
    tables = {}
    for opts in modes:
        key = opts.mode
        tables[key] = [[round(x, 4) for x in row] for row in rank_accuracy(model, lr, greedy_images, opts)]
        print(f"\n{key}: how often head d's rank-r candidate is its best-ranked one that passes ({len(lr)} validation faces, w={w:g})")
        print("head " + "".join(f"{'r=' + str(r):>7}" for r in range(len(tables[key][0]))))
        for d, row in enumerate(tables[key]):
            print(f"{d + 2:>4} " + "".join(f"{x:>7.3f}" for x in row))
        print("candidates per call " + "".join(f"{n:>7}" for n in sizes))
        print("expected tokens     " + "".join(
            f"{expected_tokens(build_tree(tables[key], n, model.cfg.n_blockwise - 1), tables[key]):>7.2f}" for n in sizes))
    if a.write:
        card = json.loads(path.read_text())
        card["tree_accuracy"] = {"faces": f"{len(lr)} validation faces, w={w:g}", "tables": tables}
        path.write_text(json.dumps(card, indent=1) + "\n")
        print(f"\nwrote the tables into {path.name}")
    return 0


def register(sub):
    p = sub.add_parser("trees", help="measure the heads' rank accuracies that tree verification is built from",
                       description="Decode validation faces greedily, then measure how often each head's "
                                   "rank-r candidate is its best-ranked one to pass each mode's rule along greedy's path; print the "
                                   "tables and the tokens per call that trees of each size would give were "
                                   "heads right independently. --write stores the tables in the weights' "
                                   "card, where decoding with tree=N builds its trees from them.")
    p.add_argument("--weights", default="cpu-finetuned", help="a weights name, card (.json) or checkpoint (.pt)")
    p.add_argument("--images", type=int, default=32, help="validation faces to measure on")
    p.add_argument("--modes", default=DEFAULT_MODES, help="decode modes, comma-separated (their rules and ranking)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="tree sizes to print expected tokens per call for")
    p.add_argument("--data", default=None, help="faces (default: the CelebA faces in ../shared/data)")
    p.add_argument("--prior-weight", type=float, default=None,
                   help="input guidance (default: the apps' default, 2, where the model has the input prior)")
    p.add_argument("--dtype", default="bfloat16", type=dtype_name, choices=["bfloat16", "float32"],
                   help="dtype of the weights")
    p.add_argument("--write", action="store_true", help="store the tables in the weights' card")
    p.set_defaults(func=cmd_trees)
