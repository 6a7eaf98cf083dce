"""Faces in real photos: detect them with landmarks, align each to the framing the model was
trained on, and paste results back into the photo.

The model learned faces as CelebA's aligned photos frame them after the paper's crop (eyes at
fixed places, some hair and background around). A user's photo is framed any way, so each face
goes through the four steps of the face restoration tools (facexlib's FaceRestoreHelper):

1. detect: MTCNN (facenet-pytorch, whose wheel ships the weights: nothing is downloaded) gives a
   box and five landmarks (eyes, nose, mouth corners) per face; its three stages are driven
   here (the pyramid resized by PIL, the networks in channels-last memory: about twice as fast
   as facenet-pytorch's own detect; experiments/face-detection-speed/); a large photo is
   detected on a reduced copy;
2. align: the similarity transform (rotation, scale, shift) that puts the landmarks where they
   sit on average in the training crops (TEMPLATE, measured by experiments/face-alignment/
   template.py) gives the face's 32x32 crop; where the crop leaves the photo, its pixels are
   reflected; the crop is drawn at a whole multiple of 32 and box-averaged down (area
   resampling, as the training crops were made); the 8x8 input is then made from the 32x32 crop
   by data.image_to_input, as for every other input;
3. the model upscales the 8x8 input (elsewhere);
4. paste back at the scale the model works at (paste_plan): where a face is larger than the
   32x32 output, the photo reduced so that its largest face is the model's 8 px input, then
   enlarged 4x; faces at most 32 px, the photo 4x. Each face's 32x32 result is warped back with
   the inverse transform and blended in with a feathered mask; pixels outside the masks stay the
   enlarged photo's.

A face too small to detect (a few pixels wide, in a crowd or a CCTV frame) can be given by its
box instead: the box is framed as MTCNN's boxes sit in the training crops (TEMPLATE_BOX).

Coordinates are continuous: pixel (col i, row j) covers [i, i+1) x [j, j+1), its centre at
(i + 0.5, j + 0.5); points are (x, y).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image

from .data import CELEBA_BOX, BadImage, center_square, image_to_input, photo_to_32, to_rgb

# MTCNN's landmarks (left eye, right eye, nose, left and right mouth corner, as seen in the photo)
# and face box (left, top, right, bottom), averaged over 200 training photos in the 32x32 training
# crop: experiments/face-alignment/template.py prints them
TEMPLATE = np.array([[11.64, 16.76], [20.69, 16.76], [16.03, 22.45], [12.06, 26.29], [20.17, 26.25]])
TEMPLATE_BOX = (6.35, 6.31, 25.99, 32.93)
# each landmark's weight in the fit: 1 / its variance about the template in those photos (the
# eyes sit within 0.3-0.4 px, the nose within 1.2): CelebA's own alignment holds the eyes, and
# so the fit holds them too
LANDMARK_WEIGHTS = np.array([7.0, 8.8, 0.65, 3.0, 2.7])
DETECT_MAX_SIDE = 1600  # photos are detected on a copy at most this large (faces >= ~20 px there)
SMALL_SIDE = 320  # smaller photos are detected on a mirrored, enlarged copy
MIN_FACE = 20  # MTCNN's smallest face (pixels, in the copy it detects on)
MIN_SCORE = 0.9  # faces MTCNN is less sure of are dropped
PYRAMID_FACTOR = 0.709  # MTCNN's step between the scales it looks for faces at
THRESHOLDS = (0.6, 0.7, 0.7)  # the score a candidate needs at MTCNN's P-Net, R-Net and O-Net
LARGEST_MARGIN = 2.5  # largest_only: a face this many times the next scale's window is the largest
PASTE_SCALE = 4  # the model's factor: 8x8 -> 32x32
PASTE_MAX_PIXELS = 64_000_000  # a pasted-back photo larger than this is made at a smaller scale
OUT_SIDE = 32  # the model's output side: a face larger than this in the photo is pasted at the model's scale
SMALL_FACE = 4  # a face under this many px at the model's scale (half its 8 px input) is named as too small
FEATHER = 3.0  # width of the paste-back mask's soft edge, in pixels of the 32x32 result


class DetectorMissing(RuntimeError):
    """facenet-pytorch is not installed (setup.sh installs it with --no-deps)."""


@lru_cache(maxsize=1)
def detector():
    """facenet-pytorch's MTCNN on the CPU (its weights load from its wheel, as state dicts); its
    three networks in channels-last memory, the layout the CPU's convolutions run fastest in."""
    import torch
    try:
        from facenet_pytorch import MTCNN
    except ImportError as e:
        raise DetectorMissing(f"face detection needs facenet-pytorch ({e}); ./setup.sh installs it "
                           "(pip install --no-deps facenet-pytorch==2.6.0)") from None
    mtcnn = MTCNN(keep_all=True, device="cpu", min_face_size=MIN_FACE, select_largest=True).eval()
    for net in (mtcnn.pnet, mtcnn.rnet, mtcnn.onet):
        net.to(memory_format=torch.channels_last)
    return mtcnn


@dataclass
class Face:
    """One face of a photo and how it maps onto the 32x32 training framing."""
    box: tuple[float, float, float, float]  # left, top, right, bottom in the photo's pixels
    landmarks: np.ndarray | None  # (5, 2) x, y in the photo's pixels; None for a drawn box
    score: float  # the detector's confidence; 1.0 for a drawn box, 0.0 for the centre square
    matrix: np.ndarray  # (3, 3): photo point -> point of the 32x32 crop
    crop: np.ndarray  # (32, 32, 3) uint8: the aligned face, the model's framing
    lr: np.ndarray  # (8, 8, 3) uint8: what the model sees (data.image_to_input of the crop)
    how: str  # "detected", "box", "centre square", "celeba crop" or "as is"

    @property
    def as_is(self) -> bool:
        """An 8x8 or 32x32 image taken as it is: the model's input or its face, no photo around it."""
        return self.how == "as is"

    @property
    def size(self) -> float:
        """The face's side in the photo's pixels (the crop's 32 px span 32 / scale of them)."""
        return 32 / math.hypot(self.matrix[0, 0], self.matrix[1, 0])

    def as_dict(self) -> dict:
        return {"box": [round(float(v), 1) for v in self.box], "score": round(float(self.score), 4),
                "landmarks": None if self.landmarks is None else np.round(self.landmarks, 1).tolist(),
                "crop_side": round(self.size, 1), "how": self.how}


# ---------------------------------------------------------------- detection

def pyramid_scales(size: tuple[int, int], min_face: int = MIN_FACE, factor: float | None = None) -> list[float]:
    """The scales P-Net sees a (width, height) photo at: at the first its 12 px window spans a
    min_face face, each next is `factor` (PYRAMID_FACTOR) smaller, down to a short side of 12 px
    (MTCNN's pyramid)."""
    factor = PYRAMID_FACTOR if factor is None else factor
    scales, scale = [], 12 / min_face
    while min(size) * scale >= 12:
        scales.append(scale)
        scale *= factor
    return scales


def net_input(pixels):
    """(n, 3, h, w) pixels (0-255, any dtype) -> MTCNN's input: float in [-1, 1), in channels-last
    memory (the layout the CPU's convolutions run fastest in)."""
    import torch
    return ((pixels.float() - 127.5) * 0.0078125).contiguous(memory_format=torch.channels_last)


def photo_tensor(work: Image.Image):
    """The photo as a (3, h, w) uint8 tensor, for cutting the candidates' crops out of."""
    import torch
    return torch.from_numpy(np.array(work)).permute(2, 0, 1)


def in_photo(photo, boxes):
    """The candidate squares with some pixels inside the (3, h, w) photo (a square the regression
    moved out of it has nothing to crop)."""
    from facenet_pytorch.models.utils.detect_face import pad
    y, ey, x, ex = pad(boxes, photo.shape[2], photo.shape[1])
    return boxes[(ex > x - 1) & (ey > y - 1)]


def square_crops(photo, boxes, side: int):
    """Each candidate square's part inside the (3, h, w) photo, area-resized to side x side:
    (n, 3, side, side) float, unrounded, as facenet-pytorch feeds its R-Net and O-Net (PIL's
    faster uint8 crops lost faces of 10-14 px: experiments/face-detection-speed/)."""
    import torch
    from facenet_pytorch.models.utils.detect_face import pad
    from torch.nn.functional import interpolate
    y, ey, x, ex = pad(boxes, photo.shape[2], photo.shape[1])  # 1-based, clipped to the photo
    return torch.cat([interpolate(photo[None, :, y[k] - 1:ey[k], x[k] - 1:ex[k]].float(), size=(side, side), mode="area")
                      for k in range(len(y))])


def run_net(net, crops, batch: int = 128):
    """A network over (n, 3, h, w) crops, `batch` at a time (a crowded photo has thousands; 128
    at a time ran faster than 512: experiments/face-detection-speed/variants.log)."""
    import torch
    outs = [net(net_input(crops[i:i + batch])) for i in range(0, len(crops), batch)]
    return tuple(torch.cat(o) for o in zip(*outs))


class Pyramid:
    """The scales P-Net sees a photo at (pyramid_scales), each box-resized from the photo by PIL;
    a small scale from the photo halved by Image.reduce (a box average too) as often as it
    stays at least 4x the scale's size, so it reads a fraction of the pixels. Any scale can be
    asked for first: the largest faces are found on the smallest scales."""

    def __init__(self, work: Image.Image):
        self.halved = [work]
        self.scales = pyramid_scales(work.size)

    def level(self, scale: float):
        w, h = self.halved[0].size
        size = (int(w * scale + 1), int(h * scale + 1))
        k, source = 0, self.halved[0]
        while source.width >= 4 * size[0] and source.height >= 4 * size[1]:
            k += 1
            if k == len(self.halved):
                self.halved.append(source.reduce(2))
            source = self.halved[k]
        return photo_tensor(source.resize(size, Image.Resampling.BOX))


def pnet_proposals(pyramid: Pyramid, scale: float):
    """MTCNN stage 1 at one scale: the windows P-Net takes for faces, (n, 9) boxes, scores and
    box regressions, each face's overlapping windows merged (non-maximum suppression)."""
    from facenet_pytorch.models.utils.detect_face import generateBoundingBox
    from torchvision.ops import nms
    reg, probs = detector().pnet(net_input(pyramid.level(scale)[None]))
    boxes, _ = generateBoundingBox(reg, probs[:, 1], scale, THRESHOLDS[0])
    return boxes[nms(boxes[:, :4], boxes[:, 4], 0.5)]


def proposed_squares(found):
    """The windows of every scale (finest first) -> the squares R-Net checks: merged across
    scales, moved by P-Net's regression and made square, (n, 5) left, top, right, bottom, score."""
    import torch
    from facenet_pytorch.models.utils.detect_face import rerec
    from torchvision.ops import nms
    boxes = torch.cat(found) if found else torch.zeros(0, 9)
    if not len(boxes):  # nothing proposed, or a photo too small for P-Net's window at every scale
        return torch.zeros(0, 5)
    boxes = boxes[nms(boxes[:, :4], boxes[:, 4], 0.7)]
    bw, bh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    boxes = torch.stack([boxes[:, 0] + boxes[:, 5] * bw, boxes[:, 1] + boxes[:, 6] * bh,
                         boxes[:, 2] + boxes[:, 7] * bw, boxes[:, 3] + boxes[:, 8] * bh, boxes[:, 4]], 1)
    return rerec(boxes)


def pnet_stage(work: Image.Image):
    """MTCNN stage 1: P-Net, a 12 px window sliding over each scale of the pyramid, proposes
    squares: (n, 5) left, top, right, bottom, score."""
    pyramid = Pyramid(work)
    return proposed_squares([pnet_proposals(pyramid, s) for s in pyramid.scales])


class Seen:
    """R-Net's and O-Net's outputs for the squares they have scored, for a search that checks
    the same squares again as it goes (mtcnn's largest_only): each is scored once."""

    def __init__(self):
        self.row, self.outputs = {}, {}  # (side, square) -> its row in outputs[side]

    def run(self, net, photo, boxes, side: int):
        import torch
        keys = [(side, *b) for b in boxes[:, :4].tolist()]  # float32 -> float -> float32: exact
        new = list(dict.fromkeys(k for k in keys if k not in self.row))
        if new:
            outs = run_net(net, square_crops(photo, torch.tensor([k[1:] for k in new]), side))
            before = self.outputs.get(side)
            n = len(before[0]) if before else 0
            self.row.update((k, n + i) for i, k in enumerate(new))
            self.outputs[side] = tuple(map(torch.cat, zip(before, outs))) if before else outs
        rows = torch.tensor([self.row[k] for k in keys])
        return tuple(o[rows] for o in self.outputs[side])


def scores(net, photo, boxes, side: int, seen: Seen | None):
    """A network's outputs for each square's side x side crop of the (3, h, w) photo."""
    if seen is not None:
        return seen.run(net, photo, boxes, side)
    return run_net(net, square_crops(photo, boxes, side))


def rnet_stage(photo, boxes, seen: Seen | None = None):
    """MTCNN stage 2: R-Net scores each proposed square (a 24x24 crop of the (3, h, w) photo)
    and refines it."""
    import torch
    from facenet_pytorch.models.utils.detect_face import bbreg, rerec
    from torchvision.ops import nms
    boxes = in_photo(photo, boxes)
    if not len(boxes):
        return boxes
    reg, probs = scores(detector().rnet, photo, boxes, 24, seen)
    keep = probs[:, 1] > THRESHOLDS[1]
    boxes, reg = torch.cat([boxes[keep, :4], probs[keep, 1:]], 1), reg[keep]
    pick = nms(boxes[:, :4], boxes[:, 4], 0.7)
    return rerec(bbreg(boxes[pick], reg[pick]))


def onet_stage(photo, boxes, seen: Seen | None = None):
    """MTCNN stage 3: O-Net scores each refined square (a 48x48 crop of the (3, h, w) photo),
    places it and its five landmarks: ((n, 5) boxes with scores, (n, 5, 2) landmarks) in the
    photo's pixels."""
    import torch
    from facenet_pytorch.models.utils.detect_face import batched_nms_numpy, bbreg
    boxes = in_photo(photo, boxes)
    if not len(boxes):
        return boxes, torch.zeros(0, 5, 2)
    reg, marks, probs = scores(detector().onet, photo, boxes, 48, seen)
    keep = probs[:, 1] > THRESHOLDS[2]
    boxes, reg, marks = torch.cat([boxes[keep, :4], probs[keep, 1:]], 1), reg[keep], marks[keep]
    bw, bh = boxes[:, 2:3] - boxes[:, 0:1] + 1, boxes[:, 3:4] - boxes[:, 1:2] + 1
    points = torch.stack([bw * marks[:, :5] + boxes[:, 0:1] - 1, bh * marks[:, 5:] + boxes[:, 1:2] - 1], -1)
    boxes = bbreg(boxes, reg)
    pick = batched_nms_numpy(boxes[:, :4], boxes[:, 4], torch.zeros(len(boxes)), 0.7, "Min")
    return boxes[pick], points[pick]


def cascade(photo, squares, seen: Seen | None = None):
    """MTCNN's stages 2 and 3 on P-Net's squares."""
    return onet_stage(photo, rnet_stage(photo, squares, seen), seen)


def mtcnn(work: Image.Image, largest_only: bool = False, min_score: float = MIN_SCORE):
    """MTCNN's three stages on a photo (facenet-pytorch's networks and steps; the pyramid resized
    by PIL, the networks in channels-last memory): ((n, 5) boxes with scores,
    (n, 5, 2) landmarks) as numpy, in the photo's pixels.

    largest_only: the pyramid is searched from its smallest scale (the largest faces) up, each
    square scored once (Seen), and the search stops once a face (score >= min_score) is found as
    large as LARGEST_MARGIN x the next scale's window (the side of a square of its box's area, as
    detect ranks faces). Measured, not derived (experiments/face-detection-speed/
    largest_margin.log): a face came out at most 2.22x the window of the coarsest scale that
    finds it (283 faces), and on 22 photos (crowds, rotated and cut faces, near ties) the search
    stopped at margin 2.5 or 3.0 gave the whole search's largest face and box on all 22, at 2.0
    on 19 (a box found on the coarse scales alone must also have settled). The faces smaller
    than it may be missing. Where no such face is found, the whole pyramid is searched: the
    faces of all mode, up to float rounding (a crop's network outputs depend on its batch by
    ~1e-7)."""
    import torch
    with torch.inference_mode():
        photo, pyramid = photo_tensor(work), Pyramid(work)
        scales = pyramid.scales
        if not largest_only:
            found = [pnet_proposals(pyramid, s) for s in scales]
            boxes, points = cascade(photo, proposed_squares(found))
        else:
            found, seen = [], Seen()
            boxes, points = torch.zeros(0, 5), torch.zeros(0, 5, 2)  # none yet
            for i in reversed(range(len(scales))):
                found.insert(0, pnet_proposals(pyramid, scales[i]))
                if len(found[0]):  # new squares: the faces found so far again
                    boxes, points = cascade(photo, proposed_squares(found), seen)
                sure = boxes[boxes[:, 4] >= min_score]
                if i > 0 and len(sure) and largest_side(sure) >= LARGEST_MARGIN * 12 / scales[i - 1]:
                    break
    return boxes.numpy().astype(float), points.numpy().astype(float)


def box_area(box):
    """A box's (left, top, right, bottom; or a stack of them, last axis) area: how detect ranks faces."""
    return (box[..., 2] - box[..., 0]) * (box[..., 3] - box[..., 1])


def largest_side(boxes) -> float:
    """The side of the square as large as the largest of (n, 4+) boxes: the box detect ranks first."""
    return float(box_area(boxes).max().clamp(min=0).sqrt())


def detect_copy(img: Image.Image, max_side: int = DETECT_MAX_SIDE) -> tuple[Image.Image, int]:
    """The copy of a photo MTCNN runs on and the padding added to each side: a photo larger than
    max_side box-reduced to it; a small one (a tight face crop, e.g. 25x25) mirrored outward by a
    quarter of its size on each side (MTCNN needs some context around a face) and enlarged to
    SMALL_SIDE."""
    work, pad = img, 0
    if max(img.size) < SMALL_SIDE:
        pad = max(img.size) // 4
        work = Image.fromarray(np.pad(np.asarray(img), ((pad, pad), (pad, pad), (0, 0)), mode="symmetric"))
    scale = min(max_side, max(SMALL_SIDE, max(work.size))) / max(work.size)
    if scale != 1:
        work = work.resize((max(1, round(work.width * scale)), max(1, round(work.height * scale))),
                           Image.Resampling.BOX if scale < 1 else Image.Resampling.BICUBIC)
    return work, pad


def detect(img: Image.Image, max_side: int = DETECT_MAX_SIDE, min_score: float = MIN_SCORE,
           largest_only: bool = False) -> list[tuple[np.ndarray, float, np.ndarray]]:
    """Faces MTCNN finds: [(box (4,), score, landmarks (5, 2))] in the photo's pixels, largest
    first, on the copy detect_copy makes. A small photo's mirrored border, there for context,
    holds mirror images of its faces: those are dropped (mirror_image). largest_only: the first
    is the largest face, the others may be missing (mtcnn); a small photo is searched whole (its
    mirror images are told from its own faces against every face found: mirror_image)."""
    img = to_rgb(img)
    work, pad = detect_copy(img, max_side)
    if min(work.size) < MIN_FACE:
        return []
    boxes, marks = mtcnn(work, largest_only and not pad, min_score)
    sx, sy = (img.width + 2 * pad) / work.width, (img.height + 2 * pad) / work.height  # exact, whatever the rounding
    found = [(b[:4] * [sx, sy, sx, sy] - pad, float(b[4]), m * [sx, sy] - pad)
             for b, m in zip(boxes, marks) if b[4] >= min_score]
    if pad:
        found = [f for f in found if not mirror_image(f, found, img.size)]
    return sorted(found, key=lambda f: -box_area(f[0]))


def mirror_image(face, found, size) -> bool:
    """Whether a face found on a small photo's mirrored copy is a mirror image from its border,
    not a face of the photo: its landmarks' centre lies outside the photo by more than a quarter
    of its box's width, or outside at all and its reflection back across the photo's edge lands
    on another face found (a face the photo cuts through, centred just outside, is kept)."""
    (l, t, r, b), _, marks = face
    w, h = size
    cx, cy = marks.mean(0)
    margin = (r - l) / 4
    if not (-margin <= cx < w + margin and -margin <= cy < h + margin):
        return True
    if 0 <= cx < w and 0 <= cy < h:
        return False
    rx = -cx if cx < 0 else 2 * w - cx if cx >= w else cx  # reflected into the photo
    ry = -cy if cy < 0 else 2 * h - cy if cy >= h else cy
    return any(o is not face and np.hypot(*(o[2].mean(0) - [rx, ry])) < margin for o in found)


# ---------------------------------------------------------------- alignment

def similarity(src: np.ndarray, dst: np.ndarray, weights=None) -> np.ndarray:
    """The weighted least-squares similarity transform (rotation, uniform scale, shift) taking
    points src to dst (Umeyama's solution), as a (3, 3) matrix."""
    src, dst = np.asarray(src, float), np.asarray(dst, float)
    w = np.ones(len(src)) if weights is None else np.asarray(weights, float)
    w = w / w.sum()
    ms, md = w @ src, w @ dst
    s, d = src - ms, dst - md
    var = w @ (s * s).sum(1)
    if not (var > 1e-12 and np.isfinite(var)):
        raise BadImage("the face's landmarks do not define an alignment")
    u, sig, vt = np.linalg.svd((d * w[:, None]).T @ s)
    flip = np.diag([1.0, np.sign(np.linalg.det(u) * np.linalg.det(vt)) or 1.0])  # a rotation, never a mirror
    rot = u @ flip @ vt
    scale = np.trace(np.diag(sig) @ flip) / var
    m = np.eye(3)
    m[:2, :2], m[:2, 2] = scale * rot, md - scale * rot @ ms
    return m


def box_matrix(box) -> np.ndarray:
    """A face box (left, top, right, bottom) -> the transform that frames it as MTCNN's boxes
    sit in the training crops (TEMPLATE_BOX): scale by the mean side, centres matched, no rotation."""
    l, t, r, b = (float(v) for v in box)
    if not (r > l and b > t):
        raise BadImage(f"a face box needs right > left and bottom > top, got {tuple(box)}")
    tl, tt, tr, tb = TEMPLATE_BOX
    s = ((tr - tl) + (tb - tt)) / ((r - l) + (b - t))
    cx, cy, tcx, tcy = (l + r) / 2, (t + b) / 2, (tl + tr) / 2, (tt + tb) / 2
    return np.array([[s, 0, tcx - s * cx], [0, s, tcy - s * cy], [0, 0, 1]])


def celeba_matrix() -> np.ndarray:
    """The paper's crop of a CelebA-aligned 178x218 photo (data.CELEBA_BOX) as a transform."""
    left, top, right, _ = CELEBA_BOX
    s = 32 / (right - left)
    return np.array([[s, 0, -s * left], [0, s, -s * top], [0, 0, 1]])


def square_matrix(size: tuple[int, int]) -> np.ndarray:
    """The centre square of a (width, height) photo as a transform: the framing used where no face is found or asked for."""
    w, h = size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    s = 32 / side
    return np.array([[s, 0, -s * left], [0, s, -s * top], [0, 0, 1]])


def apply(matrix: np.ndarray, points) -> np.ndarray:
    """(N, 2) points through a (3, 3) transform."""
    p = np.asarray(points, float)
    return p @ matrix[:2, :2].T + matrix[:2, 2]


def warp_crop(img: Image.Image | np.ndarray, matrix: np.ndarray, size: int = 32) -> np.ndarray:
    """The size x size crop that `matrix` maps the photo onto, as uint8. Sampled bilinearly at a
    whole multiple of `size` (about one sample per photo pixel, at most 8x) and box-averaged down,
    so a large face is area-resampled as the training crops were; points outside the photo take
    the mirrored pixel inside it."""
    from skimage.transform import warp
    a = to_rgb(img) if isinstance(img, Image.Image) else np.asarray(img)
    w, h = a.size if isinstance(a, Image.Image) else (a.shape[1], a.shape[0])
    inv = np.linalg.inv(matrix)
    m = int(min(8, max(1, round(math.hypot(inv[0, 0], inv[1, 0]) * 32 / size))))  # photo px per crop px
    n = size * m
    corners = apply(inv, [[0, 0], [size, 0], [0, size], [size, size]])
    # only the part of the photo the crop (and its mirror images at the edges) reads: a large
    # photo is never converted to floats whole
    lo, hi = np.floor(corners.min(0)) - 2, np.ceil(corners.max(0)) + 2
    x0 = int(max(0, min(lo[0], 2 * w - hi[0]))); x1 = int(min(w, max(hi[0], -lo[0])))
    y0 = int(max(0, min(lo[1], 2 * h - hi[1]))); y1 = int(min(h, max(hi[1], -lo[1])))
    if x1 <= x0 or y1 <= y0:  # the crop lies wholly outside the photo: mirror the whole photo
        x0, y0, x1, y1 = 0, 0, w, h
    # a photo's part is copied out of it alone (a 12 MP photo whole as an array takes longer than the warp)
    part = np.asarray(a.crop((x0, y0, x1, y1))) if isinstance(a, Image.Image) else a[y0:y1, x0:x1]
    # sample grid (n x n, pixel centres) -> crop point -> photo point -> index in `part`
    to_part = np.array([[1, 0, -x0 - 0.5], [0, 1, -y0 - 0.5], [0, 0, 1]]) @ inv @ \
        np.array([[1 / m, 0, 0.5 / m], [0, 1 / m, 0.5 / m], [0, 0, 1]])
    # mode "symmetric" mirrors about the part's edges, which are the photo's where it was cut
    # short; a part cut inside the photo is wide enough that nothing reads past it
    out = warp(part, to_part, output_shape=(n, n), order=1, mode="symmetric", preserve_range=True)
    out = out.reshape(size, m, size, m, 3).mean(axis=(1, 3))
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def make_face(img: Image.Image, matrix: np.ndarray, box, landmarks, score: float, how: str) -> Face:
    crop = warp_crop(img, matrix)
    lr, _ = image_to_input(Image.fromarray(crop))  # the one 32x32 -> 8x8 of every path
    return Face(tuple(float(v) for v in box), landmarks, float(score), matrix, crop, lr, how)


def find_faces(img: Image.Image, max_side: int = DETECT_MAX_SIDE, min_score: float = MIN_SCORE,
               largest_only: bool = False) -> list[Face]:
    """Every face MTCNN finds in a photo, aligned to the training framing, largest first
    (largest_only: the largest alone)."""
    img = to_rgb(img)
    found = detect(img, max_side, min_score, largest_only)
    return [make_face(img, similarity(marks, TEMPLATE, LANDMARK_WEIGHTS), box, marks, score, "detected")
            for box, score, marks in (found[:1] if largest_only else found)]


def face_in_box(img: Image.Image, box) -> Face:
    """A face the user boxed (left, top, right, bottom in the photo's pixels), e.g. one too small
    to detect, framed as detected faces' boxes are."""
    img = to_rgb(img)
    l, t, r, b = (float(v) for v in box)
    if r <= 0 or b <= 0 or l >= img.width or t >= img.height:
        raise BadImage(f"the box {tuple(box)} lies outside the {img.width}x{img.height} photo")
    return make_face(img, box_matrix((l, t, r, b)), (l, t, r, b), None, 1.0, "box")


def celeba_aligned(face: Face, tolerance: float = 2.0) -> bool:
    """Whether a face of a 178x218 photo sits where CelebA's alignment puts its faces: its eyes,
    through the paper's crop, within `tolerance` pixels (of the 32x32 crop) of the template's
    (in the training crops they sit within 0.3-0.4 px: experiments/face-alignment/template.log)."""
    if face.landmarks is None:
        return False
    eyes = apply(celeba_matrix(), face.landmarks[:2])
    return bool(np.linalg.norm(eyes - TEMPLATE[:2], axis=1).max() < tolerance)


def celeba_face(img: Image.Image, box=CELEBA_BOX, landmarks=None, score: float = 0.0) -> Face:
    """The paper's crop of a CelebA-aligned 178x218 photo as a Face, resampled exactly as the
    training crops were (data.photo_to_32)."""
    crop = photo_to_32(img, celeba_aligned=True)
    return Face(tuple(float(v) for v in box), landmarks, float(score), celeba_matrix(), crop,
                image_to_input(Image.fromarray(crop))[0], "celeba crop")


def own_scale(img: Image.Image) -> float:
    """The photo's own pixels per pixel of the copy read: above 1 where a large photo is read at
    reduced size (data.open_rgb records its own size as info["full_size"])."""
    return img.info.get("full_size", img.size)[0] / img.width


def as_is_face(img: Image.Image) -> Face:
    """An 8x8 or 32x32 image as a Face: it is the model's input, or its face, as it is."""
    lr, face = image_to_input(img)
    crop = face if face is not None else np.asarray(img.resize((32, 32), Image.Resampling.NEAREST), dtype=np.uint8)
    w, h = img.size
    return Face((0.0, 0.0, float(w), float(h)), None, 0.0, square_matrix(img.size), crop, lr, "as is")


def centre_face(img: Image.Image) -> Face:
    """The photo's centre square as a Face: the framing used when no face is found."""
    img = to_rgb(img)
    m = square_matrix(img.size)
    inv = np.linalg.inv(m)
    box = (*apply(inv, [[0, 0]])[0], *apply(inv, [[32, 32]])[0])
    crop = np.asarray(center_square(img).resize((32, 32), Image.Resampling.BOX), dtype=np.uint8)
    lr, _ = image_to_input(Image.fromarray(crop))
    return Face(tuple(float(v) for v in box), None, 0.0, m, crop, lr, "centre square")


def crop_like(img: Image.Image, face: Face, photo_size: tuple[int, int]) -> np.ndarray:
    """The 32x32 crop of `img`, the face's photo (photo_size) or the same scene at another size
    (e.g. its ground truth), made as face.crop was: the paper's crop and the centre square by
    their own resampling where img is the photo's size, otherwise by the face's transform scaled
    to img."""
    img = to_rgb(img)
    if img.size == tuple(photo_size) and face.how == "celeba crop":
        return photo_to_32(img, celeba_aligned=True)
    if img.size == tuple(photo_size) and face.how == "centre square":
        return centre_face(img).crop
    sx, sy = photo_size[0] / img.width, photo_size[1] / img.height  # img px -> photo px
    return warp_crop(img, face.matrix @ np.diag([sx, sy, 1.0]))


# ---------------------------------------------------------------- paste back

def paste_scale(size: tuple[int, int], scale: float = PASTE_SCALE, max_pixels: int = PASTE_MAX_PIXELS) -> float:
    """The enlargement of a pasted-back photo whose faces are small (paste_plan): `scale`, less
    where the result would pass max_pixels, but never below the photo's own size."""
    return min(float(scale), max(1.0, math.sqrt(max_pixels / (size[0] * size[1]))))


@dataclass
class PastePlan:
    """The scale a photo's faces are pasted back at (paste_plan)."""
    scale: float  # the pasted photo's side / the photo's; below 1: reduced (area) to scale / 4, then 4x
    face: int | None  # the face whose size set the scale (its index); None: the photo enlarged
    small: list[int]  # faces much smaller than the model's 8 px input at this scale
    note: str  # one line saying so


def pasted_size(size: tuple[int, int], scale: float) -> tuple[int, int]:
    """(width, height) of a photo of `size` pasted back at `scale`: below 1, 4x the photo reduced
    to scale / 4 (rounded down: no face comes out larger than the scale makes it)."""
    if scale >= 1:
        return round(size[0] * scale), round(size[1] * scale)
    r = scale / PASTE_SCALE
    return tuple(PASTE_SCALE * max(1, math.floor(v * r + 1e-9)) for v in size)


def paste_plan(size: tuple[int, int], faces: list[Face], scale: float | None = None,
               max_pixels: int = PASTE_MAX_PIXELS, own_size: tuple[int, int] | None = None) -> PastePlan:
    """The scale to paste faces back at, for the photo (width, height) they were found in: the
    scale the model works at. A face larger than the output (OUT_SIDE, 32 px) would only lose its
    own detail to a 32x32 result stretched over it, so the photo is taken as it would look with
    its largest face the model's 8 px input: reduced by 8 / that face's size, then enlarged 4x,
    and no face is pasted larger than 32 px. Faces at most 32 px gain pixels: the photo 4x
    (paste_scale: less above max_pixels). `scale` given: that scale, not chosen. Faces under
    half the 8 px input at the scale are named in the note. own_size: the photo's own size where
    `size` is a reduced copy of it (data.open_rgb): the note gives sizes and scale in its pixels."""
    sides = [f.size for f in faces]
    own = (own_size or size)[0] / size[0]  # the photo's own pixels per pixel of the copy
    big = max(range(len(sides)), key=sides.__getitem__) if sides else None
    face = None
    if scale is not None:
        note = f"the photo at {scale / own:.3g}x, as asked"
    elif big is None or sides[big] <= OUT_SIDE:
        scale = paste_scale(size, max_pixels=max_pixels)
        note = f"the photo {scale / own:.3g}x" + (", every face at most 32 px" if sides else "")
    else:
        scale, face = OUT_SIDE / sides[big], big
        note = (f"the photo at {scale / own:.3g}x, where face {big} ({sides[big] * own:.0f} px) is the "
                "model's 8 px input, enlarged 4x")
    at = min(scale, PASTE_SCALE) / PASTE_SCALE  # a face's side before the 4x: side * at
    small = [i for i, s in enumerate(sides) if s * at < SMALL_FACE]
    if small:
        many = len(small) > 1
        note += (f"; face{'s' * many} {', '.join(map(str, small))} {'are' if many else 'is'} under "
                 f"{SMALL_FACE} px before the 4x (the model's input: 8 px), too small to show much")
    w, h = pasted_size(size, scale)
    return PastePlan(float(scale), face, small, f"{w}x{h}: {note}")


def paste_canvas(img: Image.Image, scale: float) -> np.ndarray:
    """The photo at `scale` before any face is pasted (uint8): below 1 reduced (area) to scale / 4
    of its size and enlarged 4x, so its faces are what bicubic makes of the model's input;
    otherwise enlarged `scale` times (bicubic)."""
    W, H = pasted_size(img.size, scale)
    if scale < 1:
        img = img.resize((W // PASTE_SCALE, H // PASTE_SCALE), Image.Resampling.BOX)
    return np.array(img.resize((W, H), Image.Resampling.BICUBIC))


def feather_mask(points: np.ndarray, size: int = 32, feather: float = FEATHER) -> np.ndarray:
    """The paste-back weight at crop points (N, 2): 1 inside, falling smoothly to 0 over
    `feather` pixels at the crop's edges, 0 outside it."""
    edge = np.minimum(np.minimum(points[:, 0], size - points[:, 0]), np.minimum(points[:, 1], size - points[:, 1]))
    t = np.clip(edge / feather, 0, 1)
    return t * t * (3 - 2 * t)  # smoothstep: no visible seam


def paste_back(img: Image.Image, faces: list[Face], outputs, scale: float = PASTE_SCALE) -> np.ndarray:
    """The photo at `scale` (paste_canvas; paste_plan chooses it) with each face replaced by its
    32x32 output (model result), warped back with the inverse of the face's transform and blended
    in with a feathered mask. Pixels outside every face's mask are the canvas's, untouched."""
    from scipy.ndimage import map_coordinates
    img = to_rgb(img)
    canvas = paste_canvas(img, scale)  # uint8: only face regions become floats
    H, W = canvas.shape[:2]
    for face, out in zip(faces, outputs):
        out = np.asarray(out, dtype=np.float64)
        # canvas point -> crop point (each axis by its own rounding of the photo's size)
        to_crop = face.matrix @ np.diag([img.width / W, img.height / H, 1.0])
        corners = apply(np.linalg.inv(to_crop), [[0, 0], [32, 0], [0, 32], [32, 32]])
        x0, y0 = np.maximum(np.floor(corners.min(0)).astype(int), 0)
        x1, y1 = np.minimum(np.ceil(corners.max(0)).astype(int), [W, H])
        if x1 <= x0 or y1 <= y0:
            continue
        for top in range(y0, y1, 256):  # strips of rows: a large face's floats stay small
            bottom = min(y1, top + 256)
            ys, xs = np.mgrid[top:bottom, x0:x1]
            pts = apply(to_crop, np.stack([xs.ravel() + 0.5, ys.ravel() + 0.5], 1))  # pixel centres
            weight = feather_mask(pts).reshape(ys.shape)[..., None]
            # the output's pixel centres are at i + 0.5: index = point - 0.5; edges clamp ("nearest")
            face_px = np.stack([map_coordinates(out[..., c], [pts[:, 1] - 0.5, pts[:, 0] - 0.5], order=1,
                                                mode="nearest") for c in range(3)], -1).reshape(*ys.shape, 3)
            region = canvas[top:bottom, x0:x1]
            blend = weight * face_px + (1 - weight) * region
            blend = np.clip(np.round(blend), 0, 255).astype(np.uint8)
            canvas[top:bottom, x0:x1] = np.where(weight > 0, blend, region)
    return canvas


# ---------------------------------------------------------------- what every front end calls

WHICH = ("largest", "all", "none")  # none: no detection, the centre square (CelebA's crop for 178x218)
IF_NONE = ("centre", "skip", "error")


def faces_of(img: Image.Image, which: str = "largest", boxes=(), if_none: str = "centre",
             max_side: int = DETECT_MAX_SIDE) -> tuple[list[Face], str]:
    """A photo -> the faces to upscale, and a line saying what was found. `boxes` (left, top,
    right, bottom) are faces given by hand: they are used as they are, and detection is skipped.
    Otherwise the detected faces, largest first (`which`: all, or the largest alone, found
    sooner: the search stops at it; none: no detection, the centre square, or CelebA's crop of a
    178x218 photo). No face found: `if_none` centre (the centre square), skip (no faces) or error
    (BadImage)."""
    if which not in WHICH:
        raise ValueError(f"faces={which!r}: choose from {', '.join(WHICH)}")
    if if_none not in IF_NONE:
        raise ValueError(f"if_none={if_none!r}: choose from {', '.join(IF_NONE)}")
    img = to_rgb(img)
    if 0 in img.size:
        raise BadImage(f"image is {img.width}x{img.height}: it has no pixels")
    if boxes:
        faces = [face_in_box(img, b) for b in boxes]
        return faces, f"{len(faces)} face{'s' * (len(faces) != 1)} from the given box{'es' * (len(faces) != 1)}"
    if img.size in ((8, 8), (32, 32)):  # the model's input, or a face at its size: used as it is
        return [as_is_face(img)], f"a {img.width}x{img.height} image: used as it is"
    if which == "none":
        face = celeba_face(img) if img.size == (178, 218) else centre_face(img)
        return [face], face.how
    # the largest alone: the search stops at it, faces smaller than it are not looked for (mtcnn)
    found = find_faces(img, max_side, largest_only=which == "largest")
    if img.size == (178, 218):
        # a CelebA-aligned photo: the face CelebA aligned keeps the paper's crop, the training
        # framing itself (landmark alignment came within noise of it on held-out faces, not
        # better); any photo of this size may hold other faces, and be no CelebA photo at all
        found = [celeba_face(img, f.box, f.landmarks, f.score) if celeba_aligned(f) else f for f in found]
    if found:
        return found, ("the largest face found" if which == "largest"
                       else f"{len(found)} face{'s' * (len(found) != 1)} found")
    w, h = img.info.get("full_size", img.size)  # a photo read at reduced size: its own size
    msg = f"no face found in the {w}x{h} photo"
    if if_none == "error":
        raise BadImage(msg + "; give the face's box (boxes=) to upscale it")
    if if_none == "skip":
        return [], msg
    if img.size == (178, 218):  # a CelebA-aligned photo: the paper's crop, as --faces none uses
        return [celeba_face(img)], msg + ": CelebA's crop is used"
    return [centre_face(img)], msg + ": its centre square is used"
