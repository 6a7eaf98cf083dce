"""`sr-blockwise prepare`: a CelebA folder, a folder of photos or an .npz -> a 32x32 array file."""
from __future__ import annotations


def cmd_prepare(a):
    from pathlib import Path

    import numpy as np

    from ..data import DEFAULT_DATA, load_faces, save_faces

    if Path(a.out).suffix.lower() != ".npz":
        raise ValueError(f"-o {a.out}: the array file's name must end in .npz")
    replaced = Path(a.out).exists()
    faces = load_faces(a.source, limit=a.limit, progress=not a.quiet)
    save_faces(faces, a.out)
    parts = {p: len(faces.part(p)) for p in ("train", "val", "test")}
    unlabelled = len(faces) and (np.asarray(faces.split) < 0).all()
    print(f"wrote {len(faces)} faces to {a.out}{' (replacing the file there)' if replaced else ''} "
          f"(split: {parts}{'; no partition labels, so all are held-out test faces' if unlabelled else ''}); "
          f"skipped {len(faces.skipped)}")
    for path, why in faces.skipped[:20]:
        print(f"  skipped {why}")
    if len(faces.skipped) > 20:
        print(f"  ... and {len(faces.skipped) - 20} more")
    if Path(a.out).resolve() != (DEFAULT_DATA / "celeba32.npz").resolve():
        print(f"the other commands read {DEFAULT_DATA} unless told otherwise: pass --data {a.out} "
              "(train, export, evaluate, bench-decode, rate build, demo)")
    return 0


def register(sub):
    p = sub.add_parser("prepare", help="CelebA folder / photos / .npz -> a 32x32 array file")
    p.add_argument("source", help="CelebA folder (img_align_celeba/ + list_eval_partition.txt), "
                                  "a folder of photos, or an .npz")
    p.add_argument("-o", "--out", default="data/celeba32.npz",
                   help="the .npz to write, replaced if it exists (default: data/celeba32.npz under the "
                        "current folder; the other commands read ../shared/data or $SR_BLOCKWISE_DATA unless "
                        "given --data)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_prepare)
