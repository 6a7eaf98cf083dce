"""`sr-blockwise prepare`: a CelebA folder, a folder of photos or an .npz -> a 32x32 array file."""
from __future__ import annotations


def cmd_prepare(a):
    from ..data import load_faces, save_faces

    faces = load_faces(a.source, limit=a.limit, progress=not a.quiet)
    save_faces(faces, a.out)
    parts = {p: len(faces.part(p)) for p in ("train", "val", "test")}
    print(f"wrote {len(faces)} faces to {a.out} (split: {parts}); skipped {len(faces.skipped)}")
    for path, why in faces.skipped[:20]:
        print(f"  skipped {why}")
    if len(faces.skipped) > 20:
        print(f"  ... and {len(faces.skipped) - 20} more")
    return 0


def register(sub):
    p = sub.add_parser("prepare", help="CelebA folder / photos / .npz -> a 32x32 array file")
    p.add_argument("source", help="CelebA folder (img_align_celeba/ + list_eval_partition.txt), "
                                  "a folder of photos, or an .npz")
    p.add_argument("-o", "--out", default="data/celeba32.npz")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_prepare)
