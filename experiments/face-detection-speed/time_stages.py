"""Where face detection + alignment spends its time on a 12 MP and a 48 MP photo, stage by stage,
before (facenet-pytorch's MTCNN.detect on a copy made through numpy, and each face warped from the
whole photo as an array, as sr_blockwise.faces ran it) and now (sr_blockwise.faces: its own driver
of the same three networks), now at other pyramid steps (--factors), and now with the search
stopping at the largest face, as --faces largest runs it.
One thread (--threads); the paths run interleaved, --repeats times each, and the median of each
stage is printed.

Photos: photos.scene (real photos as a textured background, the astronaut and three CelebA
test-partition faces; 12 and 48 MP) and photos.portrait (12 MP, one face about 500 px wide),
saved as JPEG (quality 90) and opened as the front ends open them (data.open_rgb:
a photo over 40 MP is decoded at reduced size).

    PYTHONPATH=. python experiments/face-detection-speed/time_stages.py --repeats 5 --factors 0.709 0.6
"""
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from photos import portrait, scene
from sr_blockwise import faces as F
from sr_blockwise.data import open_rgb

p = argparse.ArgumentParser()
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--factors", type=float, nargs="*", default=[F.PYRAMID_FACTOR], help="pyramid steps to time now")
args = p.parse_args()
torch.set_num_threads(args.threads)

# ---------------------------------------------------------------- before: facenet-pytorch's detect
import facenet_pytorch.models.utils.detect_face as D  # noqa: E402
from facenet_pytorch import MTCNN  # noqa: E402

before_mtcnn = MTCNN(keep_all=True, device="cpu", min_face_size=F.MIN_FACE, select_largest=True)
marks = {}  # when detect_face first resizes crops for R-Net (24x24) and O-Net (48x48): its stage ends
_imresample = D.imresample


def imresample(img, sz):
    marks.setdefault(tuple(sz), time.perf_counter())
    return _imresample(img, sz)


D.imresample = imresample


def before(img: Image.Image) -> tuple[dict, int]:
    t = {}
    t0 = time.perf_counter()
    a = np.asarray(img)
    scale = min(F.DETECT_MAX_SIDE, max(a.shape[:2])) / max(a.shape[:2])
    work = Image.fromarray(a)
    if scale != 1:
        work = work.resize((round(work.width * scale), round(work.height * scale)), Image.Resampling.BOX)
    t1 = time.perf_counter()
    marks.clear()
    with torch.inference_mode():
        boxes, scores, lms = before_mtcnn.detect(work, landmarks=True)
    t2 = time.perf_counter()
    sx, sy = img.width / work.width, img.height / work.height
    # the warp as it was: each face read from the whole photo as an array
    faces = [F.make_face(np.asarray(img), F.similarity(m * [sx, sy], F.TEMPLATE, F.LANDMARK_WEIGHTS), b, m, s, "detected")
             for b, s, m in zip(boxes if boxes is not None else [], scores, lms if lms is not None else [])
             if s >= F.MIN_SCORE]
    t3 = time.perf_counter()
    r, o = marks.get((24, 24), t2), marks.get((48, 48), t2)
    t.update({"detection copy": t1 - t0, "P-Net pyramid": r - t1, "R-Net": o - r, "O-Net": t2 - o, "warp": t3 - t2})
    return t, len(faces)


def largest(img: Image.Image) -> tuple[dict, int]:
    """--faces largest: the pyramid searched from the largest faces down, stopping at the largest
    (faces.mtcnn's largest_only); its three stages interleave, so they are timed together."""
    t = {}
    t0 = time.perf_counter()
    work, _ = F.detect_copy(img)
    t1 = time.perf_counter()
    F.mtcnn(work, largest_only=True)
    t2 = time.perf_counter()
    found = F.detect(img, largest_only=True)[:1]  # the whole path again, in the photo's pixels, for the warp
    t3 = time.perf_counter()
    faces = [F.make_face(img, F.similarity(m, F.TEMPLATE, F.LANDMARK_WEIGHTS), b, m, s, "detected") for b, s, m in found]
    t4 = time.perf_counter()
    t.update({"detection copy": t1 - t0, "P-Net pyramid": t2 - t1, "R-Net": 0.0, "O-Net": 0.0, "warp": t4 - t3})
    return t, len(faces)


def now(img: Image.Image) -> tuple[dict, int, tuple]:
    t = {}
    t0 = time.perf_counter()
    work, _ = F.detect_copy(img)
    t1 = time.perf_counter()
    with torch.inference_mode():
        proposed = F.pnet_stage(work)
        t2 = time.perf_counter()
        photo = F.photo_tensor(work)
        refined = F.rnet_stage(photo, proposed)
        t3 = time.perf_counter()
        F.onet_stage(photo, refined)
    t4 = time.perf_counter()
    found = F.detect(img)  # the whole path again, in the photo's pixels, for the warp
    t5 = time.perf_counter()
    faces = [F.make_face(img, F.similarity(m, F.TEMPLATE, F.LANDMARK_WEIGHTS), b, m, s, "detected") for b, s, m in found]
    t6 = time.perf_counter()
    t.update({"detection copy": t1 - t0, "P-Net pyramid": t2 - t1, "R-Net": t3 - t2, "O-Net": t4 - t3, "warp": t6 - t5})
    return t, len(faces), (len(proposed), len(refined))


default_factor = F.PYRAMID_FACTOR
stages = ["open (decode)", "detection copy", "P-Net pyramid", "R-Net", "O-Net", "warp"]
tmp = Path(tempfile.mkdtemp())
print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), median of {args.repeats}\n")
print("| photo | path | " + " | ".join(stages) + " | detect + align | faces | P-Net / R-Net squares |")
print("|---|---|" + "---|" * (len(stages) + 3))
notes = []
for kind, w, h in (("scene", 4000, 3000), ("scene", 8000, 6000), ("portrait", 4000, 3000)):
    photo = scene(w, h)[0] if kind == "scene" else portrait(w, h)
    path = tmp / f"{kind}-{w}x{h}.jpg"
    photo.save(path, quality=90)
    del photo
    F.find_faces(open_rgb(path))  # warm up both paths
    before(open_rgb(path))
    names = ["before"] + [f"now, factor {f}" for f in args.factors] + ["now, largest only"]
    runs = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            t0 = time.perf_counter()
            img = open_rgb(path)
            t_open = time.perf_counter() - t0
            if name == "before":
                t, n = before(img)
                extra = ""
            elif name == "now, largest only":
                t, n = largest(img)
                extra = "(P-Net column: the three stages)"
            else:
                F.PYRAMID_FACTOR = float(name.split()[-1])
                t, n, (np_, nr) = now(img)
                F.PYRAMID_FACTOR = default_factor
                extra = f"{np_} / {nr}"
            t["open (decode)"] = t_open
            runs[name].append((t, n, extra))
    for name, rs in runs.items():
        med = {s: float(np.median([r[0][s] for r in rs])) for s in stages}
        total = sum(med[s] for s in stages[1:])
        print(f"| {kind} {w}x{h} ({w * h / 1e6:.0f} MP) | {name} | " + " | ".join(f"{med[s]:.3f}" for s in stages)
              + f" | **{total:.3f}** | {rs[0][1]} | {rs[0][2]} |")
    # the largest face as detect ranks it, and how many scales --faces largest searched for it
    work, _ = F.detect_copy(open_rgb(path))
    boxes, _ = F.mtcnn(work)
    boxes = boxes[boxes[:, 4] >= F.MIN_SCORE]
    side = float(np.sqrt(F.box_area(boxes).max())) if len(boxes) else 0.0
    searched, level = [], F.Pyramid.level
    F.Pyramid.level = lambda self, scale: searched.append(scale) or level(self, scale)
    F.mtcnn(work, largest_only=True)
    F.Pyramid.level = level
    notes.append(f"{kind} {w}x{h}: largest face {side:.0f} px in the {work.width}x{work.height} copy; largest only "
                 f"searched {len(searched)} of {len(F.pyramid_scales(work.size))} scales, down to a "
                 f"{12 / max(searched):.0f} px window")
    path.unlink()
print()
for line in notes:
    print(line)

# ---------------------------------------------------------------- what it is set against: decoding
from sr_blockwise.api import Upscaler  # noqa: E402

up = Upscaler(device="cpu")  # the shipped weights, bfloat16: the batch command's and the API's defaults
opts = up.options("exact")
faces = [f.lr for f in F.find_faces(scene(4000, 3000)[0])]
batch = np.stack((faces * 16)[:16])
up.decode(batch[:2], opts)  # warm up
timed = {1: [], 16: []}
for _ in range(args.repeats):
    for n in timed:
        t0 = time.perf_counter()
        up.decode(batch[:n], opts)
        timed[n].append((time.perf_counter() - t0) / n)
print(f"\ndecoding, exact mode (the batch command's default), bfloat16, the same threads: "
      f"{np.median(timed[1]):.3f} s a face at batch 1, {np.median(timed[16]):.3f} s a face at batch 16 "
      "(the batch command's default)")
print("\nseconds; detect + align = every stage after open (what faces.find_faces does with an opened photo;"
      " largest only: find_faces(largest_only=True), what --faces largest does)")
