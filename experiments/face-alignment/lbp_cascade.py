"""skimage's LBP frontal-face cascade, the detector the face-alignment scripts compare MTCNN with:
the largest box it finds in a photo (searched on a copy at most 512 px)."""
from functools import lru_cache

import numpy as np
import skimage.data
from PIL import Image


@lru_cache(maxsize=1)
def _cascade():
    from skimage.feature import Cascade
    return Cascade(skimage.data.lbp_frontal_face_cascade_filename())


def largest_box(img: Image.Image):
    """(left, top, width, height) of the largest box, in the photo's pixels, or None."""
    scale = min(1.0, 512 / max(img.size))
    small = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))),
                       Image.Resampling.BOX) if scale < 1 else img
    side_max = min(small.size)
    if side_max < 24:
        return None
    found = _cascade().detect_multi_scale(img=np.asarray(small), scale_factor=1.2, step_ratio=1,
                                          min_size=(24, 24), max_size=(side_max, side_max))
    if not found:
        return None
    f = max(found, key=lambda f: f["width"] * f["height"])
    return f["c"] / scale, f["r"] / scale, f["width"] / scale, f["height"] / scale
