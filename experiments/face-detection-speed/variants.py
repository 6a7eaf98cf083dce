"""The ideas measured for the P-Net pyramid and R-Net, one at a time, on the detection copy
(1600x1200) of the 12 MP timing photo (photos.scene), --threads threads (1), the best of --repeats:

- the pyramid's scales: torch's area resize of the copy as floats (facenet-pytorch), PIL's box
  resize of the copy, PIL's box resize of the copy halved by Image.reduce for the small scales (kept);
- P-Net over the pyramid: float32 in facenet-pytorch's memory layout, float32 channels-last (kept),
  each scale in one pass (kept) or in strips of rows (smaller maps), bfloat16 channels-last (the
  CPU has AMX), and on the scales of a coarser pyramid (factor 0.6);
- R-Net over the candidates P-Net proposes: the same layouts and types, 512 or 128 (kept) crops
  a batch; its crops by torch's area resize (kept) and by PIL (uint8; quality.py: it loses faces
  of 10-15 px).

    PYTHONPATH=. python experiments/face-detection-speed/variants.py --repeats 5
"""
import argparse
import copy
import time

import numpy as np
import torch
from PIL import Image
from torch.nn.functional import interpolate

from photos import scene
from pil_crops import pil_crops
from sr_blockwise import faces as F

p = argparse.ArgumentParser()
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--threads", type=int, default=1)
args = p.parse_args()
torch.set_num_threads(args.threads)


def best(f) -> float:
    f()
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


photo, _ = scene(4000, 3000)
work, _ = F.detect_copy(photo)
w, h = work.size
scales = F.pyramid_scales(work.size)
sizes = [(int(w * s + 1), int(h * s + 1)) for s in scales]


def levels_torch():
    x = torch.from_numpy(np.array(work)).permute(2, 0, 1)[None].float()
    return [interpolate(x, size=(sh, sw), mode="area") for sw, sh in sizes]


def levels_pil():
    return [work.resize(size, Image.Resampling.BOX) for size in sizes]


def levels_pil_reduce():
    out, source = [], work
    for size in sizes:
        while source.width >= 4 * size[0] and source.height >= 4 * size[1]:
            source = source.reduce(2)
        out.append(source.resize(size, Image.Resampling.BOX))
    return out


def pnet_in_strips(level, rows: int = 128):
    """P-Net over a (3, h, w) scale in strips of `rows` output rows (its 12 px window moves 2 px a
    step: output rows [r0, r1) read input rows [2 r0, 2 r1 + 10)): the maps of one pass."""
    out_rows = -(-(level.shape[1] - 2) // 2) - 4  # conv 3x3, max-pool 2 (rounding up), two convs 3x3
    outs = [nets.pnet(F.net_input(level[None, :, 2 * r0:2 * min(out_rows, r0 + rows) + 10]))
            for r0 in range(0, max(out_rows, 1), rows)]
    return tuple(torch.cat(o, 2) for o in zip(*outs))


nets = F.detector()
plain = {n: copy.deepcopy(getattr(nets, n)).to(memory_format=torch.contiguous_format) for n in ("pnet", "rnet")}
bf16 = {n: copy.deepcopy(getattr(nets, n)).to(torch.bfloat16) for n in ("pnet", "rnet")}
levels_u8 = [F.photo_tensor(level) for level in levels_pil_reduce()]
inputs = [F.net_input(level[None]) for level in levels_u8]
coarse = [F.net_input(F.photo_tensor(work.resize((int(w * s + 1), int(h * s + 1)), Image.Resampling.BOX))[None])
          for s in F.pyramid_scales(work.size, factor=0.6)]
rows = []
with torch.inference_mode():
    rows.append(("pyramid", f"torch area, floats ({len(sizes)} scales)", best(levels_torch)))
    rows.append(("pyramid", "PIL box", best(levels_pil)))
    rows.append(("pyramid", "PIL box, reduce for the small scales (kept)", best(levels_pil_reduce)))
    rows.append(("P-Net", "float32, contiguous (facenet-pytorch)", best(lambda: [plain["pnet"](x.contiguous()) for x in inputs])))
    rows.append(("P-Net", "float32, channels-last, each scale in one pass (kept)",
                 best(lambda: [nets.pnet(F.net_input(level[None])) for level in levels_u8])))
    rows.append(("P-Net", "float32, channels-last, in strips of 128 output rows (same maps)",
                 best(lambda: [pnet_in_strips(level) for level in levels_u8])))
    rows.append(("P-Net", "bfloat16, channels-last", best(lambda: [bf16["pnet"](x.to(torch.bfloat16)) for x in inputs])))
    rows.append(("P-Net", f"float32, channels-last, factor 0.6 ({len(coarse)} scales)", best(lambda: [nets.pnet(x) for x in coarse])))
    photo_t = F.photo_tensor(work)
    boxes = F.in_photo(photo_t, F.pnet_stage(work))
    crops = F.square_crops(photo_t, boxes, 24)
    x = F.net_input(crops)
    rows.append(("R-Net crops", f"torch area, floats ({len(boxes)} squares, kept)", best(lambda: F.square_crops(photo_t, boxes, 24))))
    rows.append(("R-Net crops", "PIL box, uint8", best(lambda: pil_crops(photo_t, boxes, 24))))
    rows.append(("R-Net", "float32, contiguous (facenet-pytorch)", best(lambda: plain["rnet"](x.contiguous()))))
    rows.append(("R-Net", "float32, channels-last, 512 crops a batch", best(lambda: F.run_net(nets.rnet, crops, 512))))
    rows.append(("R-Net", "float32, channels-last, 128 crops a batch (kept)", best(lambda: F.run_net(nets.rnet, crops, 128))))
    rows.append(("R-Net", "bfloat16, channels-last", best(lambda: bf16["rnet"](x.to(torch.bfloat16)))))
    same = [(nets.pnet(x)[1] - bf16["pnet"](x.to(torch.bfloat16))[1].float()).abs().max().item() for x in inputs]

print(f"torch {torch.__version__}, {args.threads} thread(s), best of {args.repeats}; 12 MP timing photo's 1600x1200 copy\n")
print("| stage | variant | s |")
print("|---|---|---|")
for stage, variant, t in rows:
    print(f"| {stage} | {variant} | {t:.4f} |")
print(f"\nbfloat16 P-Net: largest face-probability difference from float32 over the pyramid: {max(same):.3f}")
