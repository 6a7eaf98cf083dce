"""docs/faces-paste.png: faces only a few pixels wide in a small group photo, each found,
aligned, upscaled and pasted back into the photo enlarged 4x (top: bicubic 4x; bottom: pasted).

The group photo: four held-out CelebA test photos (id % 16 == 0), each framed on a 96x96 canvas
of its own mirrored surroundings at a random scale and angle, then reduced 4x (faces 10-20 px).

    PYTHONPATH=. python experiments/face-alignment/paste_figure.py
"""
import math
import sys

import numpy as np
from PIL import Image

from sr_blockwise import faces as F
from sr_blockwise.api import Upscaler
from sr_blockwise.data import DEFAULT_DATA, match_input, open_rgb

rng = np.random.default_rng(1)
folder = DEFAULT_DATA / "celeba" / "img_align_celeba"
held = sorted(f for f in folder.glob("*.jpg") if int(f.stem) > 182637 and int(f.stem) % 16 == 0)
tiles = []
for f in held[40:44]:
    a = np.pad(np.asarray(open_rgb(f)), ((218, 218), (178, 178), (0, 0)), mode="symmetric")
    s, th = rng.uniform(0.9, 1.3) * 96 / 218, math.radians(rng.uniform(-15, 15))
    c, si = math.cos(th) / s, math.sin(th) / s
    cx, cy, o = 178 + 89, 218 + 109, 48
    tiles.append(Image.fromarray(a).transform((96, 96), Image.Transform.AFFINE,
                                              (c, -si, cx - c * o + si * o, si, c, cy - si * o - c * o),
                                              Image.Resampling.BICUBIC))
group = Image.fromarray(np.concatenate([np.asarray(t) for t in tiles], 1))
group = group.resize((group.width // 4, group.height // 4), Image.Resampling.BOX)  # 96x24: tiny faces
found, note = F.faces_of(group, "all")
print(f"{group.width}x{group.height} photo: {note}; crop sides {[round(f.size, 1) for f in found]} px")
if not found:
    sys.exit("no face found")
up = Upscaler("cpu-finetuned", device="cpu", dtype="float32")
lrs = np.stack([f.lr for f in found])
outs = match_input(up.decode(lrs, up.options("exact"))[0], lrs)
pasted = F.paste_back(group, found, outs)
plain = np.asarray(group.resize((group.width * 4, group.height * 4), Image.Resampling.BICUBIC))
both = np.concatenate([plain, np.full((2, plain.shape[1], 3), 255, np.uint8), pasted], 0)
Image.fromarray(both).resize((both.shape[1] * 2, both.shape[0] * 2), Image.Resampling.NEAREST).save("docs/faces-paste.png")
print("docs/faces-paste.png: bicubic 4x above, faces pasted back below (shown 2x, nearest)")
