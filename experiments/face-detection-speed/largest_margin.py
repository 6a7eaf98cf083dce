"""--faces largest (faces.mtcnn's largest_only) searches the pyramid from its largest windows
down and stops at a face that no face on the scales left could outgrow (LARGEST_MARGIN x the
next scale's window). Two questions:

1. How much larger than the window that finds it can a face's box come out? The bound a stop
   needs on a face not yet found: each face of a whole search (its size: the side of a square of
   its box's area, as detect ranks faces) over the window of the coarsest scale that finds it
   (matched, IoU > 0.5, to the faces each scale finds on its own). Photos: crowds of CelebA
   test-partition faces (squares 16-300 px) and the timing scenes (photos.py), on their copies.
2. Does the search, stopped at a margin, give the whole search's largest face with the whole
   search's box (the face found must also have settled)? At margins 1.0-3.0, on those photos,
   the portrait, and harder ones: a 500 px CelebA face rotated 30-180 degrees beside a 300 px
   one, the astronaut cut by the photo's edge, two faces of one size (near ties).

    PYTHONPATH=. python experiments/face-detection-speed/largest_margin.py     # largest_margin.log
"""
import numpy as np
import skimage.data
import torch
from PIL import Image
from torchvision.ops import box_iou

from photos import background, celeba_test_photos, crowd, portrait, scene
from sr_blockwise import faces as F
from sr_blockwise.data import CELEBA_BOX

torch.set_num_threads(2)
photos = [(f"crowd 1600x1200, squares 16-300 px, skip {s}", crowd(1600, 1200, np.linspace(16, 300, 49).astype(int), skip=s)[0])
          for s in (1, 2, 3, 4)]
photos += [(f"crowd 1600x1200, squares 16-80 px, skip {s}", crowd(1600, 1200, np.linspace(16, 80, 49).astype(int), skip=s)[0])
           for s in (5, 6)]
photos += [(f"scene {w}x{h}", scene(w, h)[0]) for w, h in ((1600, 1200), (4000, 3000), (2000, 1500))]
ratios = []
with torch.inference_mode():
    for name, photo in photos:
        work, _ = F.detect_copy(photo)
        image, pyramid = F.photo_tensor(work), F.Pyramid(work)
        every, _ = F.cascade(image, F.proposed_squares([F.pnet_proposals(pyramid, s) for s in pyramid.scales]))
        every = every[every[:, 4] >= F.MIN_SCORE]
        coarsest = torch.zeros(len(every))  # the window of the coarsest scale that finds each face
        for s in pyramid.scales:  # finest first: the last scale to find a face is its coarsest
            alone, _ = F.cascade(image, F.proposed_squares([F.pnet_proposals(pyramid, s)]))
            alone = alone[alone[:, 4] >= F.MIN_SCORE]
            if len(alone) and len(every):
                coarsest[box_iou(every[:, :4], alone[:, :4]).max(1).values > 0.5] = 12 / s
        side = F.box_area(every).sqrt()
        found = coarsest > 0
        ratios += [(float(r), name, float(sd)) for r, sd in zip(side[found] / coarsest[found], side[found])]
        print(f"{name}: {len(every)} faces, {int((~found).sum())} found by no scale alone")
r = np.array([x[0] for x in ratios])
top = sorted(ratios)[-3:]
print(f"\nface size / window of the coarsest scale finding it, over {len(r)} faces: "
      f"median {np.median(r):.2f}, 99th percentile {np.percentile(r, 99):.2f}, max {r.max():.2f}; "
      f"the largest three: " + "; ".join(f"{x:.2f} ({name}, a {sd:.0f} px face)" for x, name, sd in top))

# ---------------------------------------------------------------- 2. stopped at a margin vs whole
faces = celeba_test_photos(6, skip=7)
extra = []
for degrees in (30, 45, 60, 90, 180):
    canvas = background(1600, 1200)
    canvas.paste(faces[0].crop(CELEBA_BOX).resize((500, 500), Image.Resampling.BOX).rotate(degrees, Image.Resampling.BICUBIC), (150, 300))
    canvas.paste(faces[1].crop(CELEBA_BOX).resize((300, 300), Image.Resampling.BOX), (1000, 400))
    extra.append((f"a 500 px face rotated {degrees} beside a 300 px one", canvas))
astronaut = Image.fromarray(skimage.data.astronaut()).resize((700, 700), Image.Resampling.BICUBIC)
for x, y in ((-330, 200), (1240, 200), (450, -250), (450, 860)):
    canvas = background(1600, 1200)
    canvas.paste(astronaut, (x, y))
    extra.append((f"the astronaut cut by the edge at ({x}, {y})", canvas))
for i in range(3):
    canvas = background(1600, 1200)
    for j, x in enumerate((200, 900)):
        canvas.paste(faces[2 + i + j].crop(CELEBA_BOX).resize((400, 400), Image.Resampling.BOX), (x, 400))
    extra.append((f"two faces of one size ({i})", canvas))
extra.append(("portrait 1600x1200", portrait(1600, 1200)))
margins = (1.0, 1.5, 2.0, 2.5, 3.0)
print(f"\n| photo | whole search: largest face (px) | " + " | ".join(f"margin {m}" for m in margins) + " |")
print("|---|---|" + "---|" * len(margins))
differ = {m: [0, 0] for m in margins}  # another face, the same face with another box
default = F.LARGEST_MARGIN
for name, photo in photos + extra:
    whole = F.detect(photo)
    side = np.sqrt(F.box_area(whole[0][0])) if whole else 0
    cells = []
    for m in margins:
        F.LARGEST_MARGIN = m
        alone = F.detect(photo, largest_only=True)
        F.LARGEST_MARGIN = default
        if not whole or not alone:
            cells.append("same (none)" if not whole and not alone else "NONE vs a face")
            continue
        a, b = whole[0][0], alone[0][0]
        if np.abs(a - b).max() < 0.01 * side:
            cells.append("same")
        elif float(box_iou(torch.tensor(np.array([a])), torch.tensor(np.array([b])))[0, 0]) > 0.5:
            differ[m][1] += 1
            cells.append(f"box {np.sqrt(F.box_area(b)):.0f} px")
        else:
            differ[m][0] += 1
            cells.append("another face")
    print(f"| {name} | {side:.0f} | " + " | ".join(cells) + " |")
print("\nphotos where the stopped search differs from the whole one (another face / the same face, "
      f"another box), of {len(photos) + len(extra)}: " + ", ".join(f"margin {m}: {a} / {b}" for m, (a, b) in differ.items())
      + f"; LARGEST_MARGIN {default}")
