"""How much larger than the window that finds it can a face's box come out? --faces largest
(faces.mtcnn's largest_only) searches the pyramid from its largest windows down and stops at a
face no face on the scales left could outgrow: that needs a bound on a face's final size (the
side of a square of its box's area, as detect ranks faces) over the window of the coarsest
scale that finds it. Each face of a whole search is matched (IoU > 0.5) to the faces each scale
finds on its own; photos: crowds of CelebA test-partition faces (squares 16-300 px) and the
timing scenes (photos.py), on their detection copies.

    PYTHONPATH=. python experiments/face-detection-speed/largest_margin.py     # largest_margin.log
"""
import numpy as np
import torch
from torchvision.ops import box_iou

from photos import crowd, scene
from sr_blockwise import faces as F

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
        side = ((every[:, 2] - every[:, 0]) * (every[:, 3] - every[:, 1])).sqrt()
        found = coarsest > 0
        ratios += (side[found] / coarsest[found]).tolist()
        print(f"{name}: {len(every)} faces, {int((~found).sum())} found by no scale alone")
r = np.array(ratios)
print(f"\nface size / window of the coarsest scale finding it, over {len(r)} faces: "
      f"median {np.median(r):.2f}, 99th percentile {np.percentile(r, 99):.2f}, max {r.max():.2f}; "
      f"the five largest {np.sort(r)[-5:].round(2).tolist()}; LARGEST_MARGIN {F.LARGEST_MARGIN}")
