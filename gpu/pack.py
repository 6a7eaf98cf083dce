"""CelebA faces in a compact lossless format, to copy them to a training machine.

celeba32.npz holds the faces raw (92.6 MB). Lossless WebP mosaics of 32x32 faces take ~55% of
the raw bytes (zlib: 96%, PNG: 75%): `pack` writes the training faces (and a few validation
faces, for the training log's bits/dim) as mosaics of 1,024 faces, `unpack` turns them back into
the .npz that `sr-blockwise train` reads. Held-out test faces are never packed into a training
set; `test-faces` writes a few of them apart, for decoding measurements (gpu/bench_decode.py).

    python gpu/pack.py pack .gpu/faces                     # every training face, ~52 MB
    python gpu/pack.py pack .gpu/faces --max-mb 28 --seed 1  # a random subset that fits 28 MB
    python gpu/pack.py unpack .gpu/faces SCRATCH/faces.npz   # on the training machine

Unpack checks the sha256 of the images against the one pack wrote, so a lossy path cannot slip in.
It needs only what sr_blockwise.data needs (numpy, Pillow, tqdm).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from sr_blockwise.data import Faces, load_faces, save_faces  # noqa: E402

SIDE = 32  # faces per mosaic side: a 1024x1024 WebP holds 1,024 faces (~1.8 MB)


def _sha(images: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest()


def to_mosaic(faces: np.ndarray) -> np.ndarray:
    """(SIDE*SIDE, 32, 32, 3) faces -> one (SIDE*32, SIDE*32, 3) image, row by row."""
    return faces.reshape(SIDE, SIDE, 32, 32, 3).transpose(0, 2, 1, 3, 4).reshape(SIDE * 32, SIDE * 32, 3)


def from_mosaic(grid: np.ndarray) -> np.ndarray:
    """The inverse of to_mosaic."""
    return grid.reshape(SIDE, 32, SIDE, 32, 3).transpose(0, 2, 1, 3, 4).reshape(-1, 32, 32, 3)


def pack(out: Path, data: Path, max_mb: float | None, n_val: int, seed: int) -> dict:
    """Validation faces first, then training faces in a random order, while they fit max_mb
    (None: all of them)."""
    faces = load_faces(data)
    train, val = faces.part("train"), faces.part("val")
    order = np.random.default_rng(seed).permutation(len(train))  # a random subset when not all fit
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("mosaic-*.webp"), out / "meta.json"]:  # never a stale pack
        old.unlink(missing_ok=True)
    # validation faces first (the training log's bits/dim), then training faces until the budget
    pool_images = np.concatenate([val.images[:n_val], train.images[order]])
    pool_ids = np.concatenate([val.ids[:n_val], train.ids[order]])
    pool_split = np.concatenate([val.split[:n_val], train.split[order]])
    per = SIDE * SIDE
    used, n = 0, 0
    for i in range(0, len(pool_images), per):
        chunk = pool_images[i:i + per]
        grid = np.zeros((per, 32, 32, 3), np.uint8)
        grid[:len(chunk)] = chunk
        path = out / f"mosaic-{i // per:03d}.webp"
        Image.fromarray(to_mosaic(grid)).save(path, "WEBP", lossless=True, quality=100, method=6)
        size = path.stat().st_size
        if max_mb is not None and used + size > max_mb * 1e6:  # over the budget: keep whole mosaics only
            path.unlink()
            break
        used, n = used + size, n + len(chunk)
    n_val = int(min(n_val, len(val)))
    if n <= n_val:  # not one training face: the run would have nothing to learn from
        if max_mb is None:
            raise SystemExit(f"{data}: no training faces to pack")
        raise SystemExit(f"the budget of {max_mb:.1f} MB holds {n} faces, not more than the {n_val} "
                         f"validation faces: no training face fits (one mosaic of {per} faces is ~1.8 MB)")
    meta = {"n": n, "ids": pool_ids[:n].tolist(), "split": pool_split[:n].tolist(),
            "sha256": _sha(pool_images[:n]), "side": SIDE, "source": str(data),
            "n_val": n_val, "n_train_all": int(len(train)), "bytes": used}
    (out / "meta.json").write_text(json.dumps(meta))
    return meta


def unpack(src: Path, out: Path) -> int:
    meta = json.loads((src / "meta.json").read_text())
    if meta["side"] != SIDE:
        raise SystemExit(f"{src}: packed with {meta['side']} faces a side, this pack.py uses {SIDE}")
    n = meta["n"]
    tiles = [from_mosaic(np.asarray(Image.open(p).convert("RGB"))) for p in sorted(src.glob("mosaic-*.webp"))]
    if not tiles:
        raise SystemExit(f"{src}: no mosaic-*.webp files")
    images = np.concatenate(tiles)[:n]
    if len(images) != n or _sha(images) != meta["sha256"]:
        raise SystemExit(f"{src}: unpacked faces do not match what was packed (sha256 or count)")
    save_faces(Faces(images, np.array(meta["ids"], np.int64), np.array(meta["split"], np.int64), [], []), out)
    return n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack", help="training (+ a few validation) faces -> lossless WebP mosaics")
    a.add_argument("out", type=Path)
    a.add_argument("--data", type=Path, default=None, help="default: ../shared/data/celeba32.npz")
    a.add_argument("--max-mb", type=float, default=None,
                   help="at most this many MB of mosaics: a random subset of the training faces (default: all of them)")
    a.add_argument("--n-val", type=int, default=256, help="validation faces to include")
    a.add_argument("--seed", type=int, default=0)
    b = sub.add_parser("unpack", help="mosaics -> .npz (images, celeba_id, split)")
    b.add_argument("src", type=Path)
    b.add_argument("out", type=Path)
    c = sub.add_parser("test-faces", help="the first N held-out test faces -> .npz, for decoding there "
                                           "(gpu/bench_decode.py; no weights are trained on them)")
    c.add_argument("out", type=Path)
    c.add_argument("--data", type=Path, default=None, help="default: ../shared/data/celeba32.npz")
    c.add_argument("--n", type=int, default=256)
    args = p.parse_args(argv)
    if args.cmd == "test-faces":
        faces = load_faces(args.data, part="test")
        save_faces(faces.subset(np.arange(len(faces)) < args.n), args.out)
        print(f"wrote {min(args.n, len(faces))} held-out test faces to {args.out}")
    elif args.cmd == "pack":
        m = pack(args.out, args.data, args.max_mb, args.n_val, args.seed)
        print(f"packed {m['n']} faces ({m['n_val']} validation, {m['n'] - m['n_val']} of "
              f"{m['n_train_all']} training) in {m['bytes'] / 1e6:.1f} MB under {args.out}")
    else:
        print(f"unpacked {unpack(args.src, args.out)} faces to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
