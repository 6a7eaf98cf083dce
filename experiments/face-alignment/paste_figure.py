"""docs/faces-paste.png: faces only a few pixels wide in a small group photo, each found,
aligned, upscaled and pasted back into the photo enlarged 4x (top: bicubic 4x; bottom: pasted).

The group photo: scikit-image's astronaut four times, two of them mirrored (no CelebA pixels
go into the docs; the cameraman's face, turned down, is not found at that size), each framed on
a 96x96 canvas of her photo at a random scale and angle (the training framing at 0.55-0.75 of
the canvas; mirrored where the photo ends), then reduced 4x (faces 13-18 px).

    PYTHONPATH=. python experiments/face-alignment/paste_figure.py
"""
import math
import sys

import numpy as np
import skimage.data
from PIL import Image

from sr_blockwise import faces as F
from sr_blockwise.api import Upscaler
from sr_blockwise.data import match_input

rng = np.random.default_rng(1)
astronaut = Image.fromarray(skimage.data.astronaut())
people = [astronaut, astronaut.transpose(Image.Transpose.FLIP_LEFT_RIGHT)] * 2
tiles, sides = [], []
for img in people:
    face = F.find_faces(img, largest_only=True)[0]
    s, th = rng.uniform(0.55, 0.75) * 96 / 32, math.radians(rng.uniform(-15, 15))
    c, si = math.cos(th) * s, math.sin(th) * s  # crop point -> tile point: about the centres
    tile = np.array([[c, -si, 48 - 16 * (c - si)], [si, c, 48 - 16 * (si + c)], [0, 0, 1]])
    tiles.append(Image.fromarray(F.warp_crop(img, tile @ face.matrix, 96)))
    sides.append(32 * s / 4)  # the face's crop side in the group photo, reduced 4x
group = Image.fromarray(np.concatenate([np.asarray(t) for t in tiles], 1))
group = group.resize((group.width // 4, group.height // 4), Image.Resampling.BOX)  # 96x24: tiny faces
found, note = F.faces_of(group, "all")
print(f"{group.width}x{group.height} photo, faces of {[round(v, 1) for v in sides]} px (left to right): {note}; "
      f"found in tiles {sorted(int((f.box[0] + f.box[2]) / 2 // 24) + 1 for f in found)}, "
      f"crop sides {[round(f.size, 1) for f in found]} px")
if not found:
    sys.exit("no face found")
up = Upscaler("cpu-finetuned", device="cpu", dtype="float32")
lrs = np.stack([f.lr for f in found])
outs = match_input(up.decode(lrs, up.options("exact"))[0], lrs)
plan = F.paste_plan(group.size, found)  # faces of at most 32 px: the photo 4x
pasted = F.paste_back(group, found, outs, plan.scale)
plain = np.asarray(group.resize((group.width * 4, group.height * 4), Image.Resampling.BICUBIC))
both = np.concatenate([plain, np.full((2, plain.shape[1], 3), 255, np.uint8), pasted], 0)
Image.fromarray(both).resize((both.shape[1] * 2, both.shape[0] * 2), Image.Resampling.NEAREST).save("docs/faces-paste.png")
print(f"docs/faces-paste.png: bicubic 4x above, faces pasted back below ({plan.note}; shown 2x, nearest)")
