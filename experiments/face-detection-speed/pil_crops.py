"""R-Net's and O-Net's crops made by PIL instead of torch's area resize: each candidate square's
part inside the photo box-resized to side x side and rounded to uint8 (faster to make; it loses
faces of 10-15 px: quality.py --pil-crops). Same signature as sr_blockwise.faces.square_crops."""
import numpy as np
import torch
from facenet_pytorch.models.utils.detect_face import pad
from PIL import Image


def pil_crops(photo, boxes, side: int):
    img = Image.fromarray(photo.permute(1, 2, 0).numpy())
    y, ey, x, ex = pad(boxes, img.width, img.height)
    out = np.stack([np.asarray(img.resize((side, side), Image.Resampling.BOX, box=(x[k] - 1, y[k] - 1, ex[k], ey[k])))
                    for k in range(len(y))])
    return torch.from_numpy(out).permute(0, 3, 1, 2)
