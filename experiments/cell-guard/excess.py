"""How far does a real face's 4x4 cell drift from its 8x8 input pixel while it is decoded?

For every cell and channel of real faces, in decoding order (row by row), D_n is the sum of
(pixel - the input pixel) over the cell's first n pixels, and D_n / 16 the cell's mean offset
from its input pixel if its other pixels were the input pixel (the cell guard's measure,
decoding.cell_guard). The largest |D_n| / 16 over n = 1..15 of each cell, as quantiles over the
cells and over faces (each face's largest).

    PYTHONPATH=. python experiments/cell-guard/excess.py   # excess.log
"""
import numpy as np

from sr_blockwise.data import downsample_8, load_faces

faces = load_faces(None)
for part in ("train", "test"):
    real = faces.part(part).images[:4000].astype(np.int64)
    lr = downsample_8(real).astype(np.int64)
    d = real.reshape(-1, 8, 4, 8, 4, 3) - lr[:, :, None, :, None, :]
    d = d.transpose(0, 1, 3, 5, 2, 4).reshape(len(real), 8, 8, 3, 16)  # a cell's 16 pixels in decoding order
    drift = np.abs(np.cumsum(d, -1)[..., :15] / 16).max(axis=-1)  # (faces, 8, 8, 3)
    cells = np.percentile(drift, [99, 99.9, 99.99]).round(1)
    per_face = np.percentile(drift.max(axis=(1, 2, 3)), [50, 90, 99]).round(1)
    print(f"{part}: {len(real)} faces; a cell's largest drift (levels), quantiles 99 / 99.9 / 99.99%: "
          f"{' / '.join(map(str, cells))}, largest {drift.max():.1f}; a face's largest, median / 90 / 99%: "
          f"{' / '.join(map(str, per_face))}")
