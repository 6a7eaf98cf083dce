"""Does aligning faces to the training framing help on photos framed any other way?

Three ways to make the 8x8 input of a photo, each scored against the real face in its own
framing at 32x32 (the 32x32 crop the same way makes, before the 8x8 downsample):
  aligned: MTCNN landmarks -> similarity transform to the training template (sr_blockwise.faces)
  centre:  the photo's centre square (`--faces none`)
  cascade: skimage's LBP cascade box grown 1.5x into a square (a simpler detector, no landmarks;
           the centre square where it finds nothing)

Photos (all offline):
  lfw:      skimage.data.lfw_subset(), the first --lfw faces (25x25 grey, tight crops)
  astronaut: skimage.data.astronaut() (512x512)
  portraits: the other face photos the installed packages ship: matplotlib's sample photo of Grace
            Hopper (512x600) and skimage's cameraman (512x512 grey)
  reframed: held-out CelebA test faces (id % 16 == 0), each mirrored outward and given a random similarity
            (scale 0.45-1.2, rotation +-25 degrees, shift) into a 256x256 photo
  celeba:   held-out CelebA photos as they are (178x218): aligned vs the paper's crop (paper-crop)
Decoding: shipped cpu-finetuned, exact mode (identical to greedy) at its default input guidance
and the apps' cell guard (--guard; 0 for the decoder as trained);
scores on the decoder's own outputs and on outputs matched to the 8x8 input (the default in
the batch command, the demo and the API); the share of faces where aligned beats another framing
is given for both.
A face "collapses" where some 4x4 cell of the decoder's own output is off its input pixel by
more than --collapse levels in some channel.

    PYTHONPATH=. python experiments/face-alignment/compare.py --lfw 24 --reframed 16 --celeba 16
"""
import argparse
import math
import tempfile
import time
from pathlib import Path

import matplotlib.cbook
import numpy as np
import skimage.data
from PIL import Image

from lbp_cascade import largest_box
from sr_blockwise import faces as F
from sr_blockwise.api import Upscaler
from sr_blockwise.data import DEFAULT_DATA, CELEBA_BOX, downsample_8, match_input, open_rgb, part_mask
from sr_blockwise.metrics import Perceptual, psnr, ssim

p = argparse.ArgumentParser()
p.add_argument("--lfw", type=int, default=24)
p.add_argument("--reframed", type=int, default=16)
p.add_argument("--celeba", type=int, default=16)
p.add_argument("--collapse", type=int, default=48, help="levels (the input-guidance experiment's definition)")
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--prior-weight", type=float, default=None, help="input guidance (default: the weights')")
p.add_argument("--guard", type=float, default=None,
               help="the cell guard's tolerance (default: the apps', decoding.DEFAULT_GUARD; 0: off)")
p.add_argument("--figures", default="docs", help="folder for faces-grid.png")
args = p.parse_args()
rng = np.random.default_rng(0)


def cascade_square(img: Image.Image) -> Image.Image | None:
    """The LBP cascade's face crop: the largest box grown 1.5x into a square."""
    box = largest_box(img)
    if box is None:
        return None
    x, y, w, h = box
    cx, cy = x + w / 2, y + h / 2
    side = min(1.5 * w, img.width, img.height)
    left = min(max(cx - side / 2, 0), img.width - side)
    top = min(max(cy - side / 2, 0), img.height - side)
    return img.crop((round(left), round(top), round(left + side), round(top + side)))


def crops(img: Image.Image) -> dict:
    """The real 32x32 face of each framing (None where aligned finds no face)."""
    found = F.find_faces(img)
    sq = cascade_square(img)
    return {"aligned": found[0].crop if found else None,
            "centre": F.centre_face(img).crop,
            "cascade": F.centre_face(sq if sq is not None else img).crop,
            "face": found[0] if found else None}


def reframe(photo: Image.Image, size=256) -> tuple[Image.Image, np.ndarray]:
    """A CelebA photo mirrored outward and moved by a random similarity into a size x size photo,
    and the transform that takes that photo to the paper's crop of the original (the training
    framing, known exactly: the `ideal` framing)."""
    a = np.pad(np.asarray(photo), ((218, 218), (178, 178), (0, 0)), mode="symmetric")
    s = rng.uniform(0.45, 1.2) * size / 218  # the 178x218 photo's height -> this many output px
    th = math.radians(rng.uniform(-25, 25))
    cx, cy = 178 + 89, 218 + 109 + 0  # the photo's centre in the padded array
    ox, oy = size / 2 + rng.uniform(-0.25, 0.25) * size, size / 2 + rng.uniform(-0.2, 0.2) * size
    # output point -> padded-photo point (PIL's AFFINE takes the inverse map)
    c, si = math.cos(th) / s, math.sin(th) / s
    inv = (c, -si, cx - c * ox + si * oy, si, c, cy - si * ox - c * oy)
    out = Image.fromarray(a).transform((size, size), Image.Transform.AFFINE, inv, Image.Resampling.BICUBIC)
    to_padded = np.array([[inv[0], inv[1], inv[2]], [inv[3], inv[4], inv[5]], [0, 0, 1]])
    unpad = np.array([[1, 0, -178], [0, 1, -218], [0, 0, 1]])
    return out, F.celeba_matrix() @ unpad @ to_padded


# ---------------------------------------------------------------- the photos
t0 = time.perf_counter()
photos = []  # (set, name, PIL image)
lfw = skimage.data.lfw_subset()
for i in range(args.lfw):
    photos.append(("lfw", f"lfw-{i}", Image.fromarray(np.round(lfw[i] * 255).astype(np.uint8)).convert("RGB")))
photos.append(("astronaut", "astronaut", Image.fromarray(skimage.data.astronaut())))
with Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg")) as im:
    photos.append(("portraits", "grace-hopper", im.convert("RGB")))
photos.append(("portraits", "cameraman", Image.fromarray(skimage.data.camera()).convert("RGB")))
root = DEFAULT_DATA / "celeba"
partition = dict(line.split() for line in (root / "list_eval_partition.txt").read_text().splitlines() if line.strip())
files = sorted((root / "img_align_celeba").glob("*.jpg"))
held = [f for f, k in zip(files, part_mask("test", np.array([int(f.stem) for f in files]),
                                             np.array([int(partition.get(f.name, -1)) for f in files]))) if k]
ideal = {}  # reframed photo -> the transform to its training framing
for f in held[: args.reframed]:
    img, ideal[f.stem] = reframe(open_rgb(f))
    photos.append(("reframed", f.stem, img))
celeba = held[args.reframed: args.reframed + args.celeba]  # other held-out faces, as they are

rows = []
for kind, name, img in photos:
    rows.append({"set": kind, "name": name, "img": img, **crops(img)})
    if name in ideal:
        rows[-1]["ideal"] = F.warp_crop(img, ideal[name])
        # how much smaller the face is in the centre square than in the training framing
        rows[-1]["zoom out"] = min(img.size) * math.hypot(*ideal[name][:2, 0]) / 32
for f in celeba:
    img = open_rgb(f)
    found = F.find_faces(img)
    rows.append({"set": "celeba", "name": f.stem, "img": img, "aligned": found[0].crop if found else None,
                 "face": found[0] if found else None,
                 "paper-crop": np.asarray(img.crop(CELEBA_BOX).resize((32, 32), Image.Resampling.BOX))})
print(f"{len(rows)} photos prepared in {time.perf_counter() - t0:.0f} s; aligned found a face in "
      f"{sum(r['aligned'] is not None for r in rows)}")

# ---------------------------------------------------------------- decode every framing at once
up = Upscaler("cpu-finetuned", device="cpu", dtype="float32")
opts = up.options("exact", prior_weight=args.prior_weight, guard=args.guard)
print(f"input guidance {opts.prior_weight:g}, cell guard {opts.guard:g}")
jobs = [(i, fr) for i, r in enumerate(rows) for fr in ("aligned", "centre", "cascade", "paper-crop", "ideal") if r.get(fr) is not None]
real = np.stack([rows[i][fr] for i, fr in jobs])
lr = downsample_8(real)
# each distinct input once (the cascade falls back to the centre square where it finds nothing)
uniq, back = np.unique(lr.reshape(len(lr), -1), axis=0, return_inverse=True)
uniq = uniq.reshape(-1, 8, 8, 3)
t0 = time.perf_counter()
outs = np.concatenate([up.decode(uniq[s:s + args.batch_size], opts)[0] for s in range(0, len(uniq), args.batch_size)])
decode_s = time.perf_counter() - t0
outs = outs[back.ravel()]
print(f"decoded {len(uniq)} distinct inputs of {len(lr)} in {decode_s:.0f} s "
      f"({decode_s / len(uniq):.2f} s a face, batch {args.batch_size})")
matched = match_input(outs, lr)
cells = outs.reshape(-1, 8, 4, 8, 4, 3).astype(float).mean(axis=(2, 4))
collapsed = (np.abs(cells - lr).max(axis=(1, 2, 3)) > args.collapse)
alex, vgg = Perceptual("stlpips"), Perceptual("stlpips-vgg")
score = {}
for tag, o in (("raw", outs), ("matched", matched)):
    score[tag] = {"alex": alex(real, o), "vgg": vgg(real, o), "psnr": psnr(real, o), "ssim": ssim(real, o)}
bic = np.stack([np.asarray(Image.fromarray(x).resize((32, 32), Image.Resampling.BICUBIC)) for x in lr])
score["bicubic"] = {"alex": alex(real, bic), "vgg": vgg(real, bic), "psnr": psnr(real, bic), "ssim": ssim(real, bic)}
idx = {(i, fr): j for j, (i, fr) in enumerate(jobs)}


def table(sets, framings, title):
    print(f"\n## {title}\n")
    print("| photos | framing | faces | ST-LPIPS alex | ST-LPIPS vgg | PSNR | SSIM | matched: alex / vgg / PSNR / SSIM | bicubic: alex / PSNR / SSIM | collapsed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in sets:
        # faces every framing of the set has (aligned needs a detection)
        keep = [i for i, r in enumerate(rows) if r["set"] in s and all((i, fr) in idx for fr in framings)]
        for fr in framings:
            j = [idx[(i, fr)] for i in keep]
            r, m, b = score["raw"], score["matched"], score["bicubic"]
            print(f"| {'+'.join(s)} | {fr} | {len(j)} | {r['alex'][j].mean():.3f} | {r['vgg'][j].mean():.3f} | "
                  f"{r['psnr'][j].mean():.2f} | {r['ssim'][j].mean():.3f} | {m['alex'][j].mean():.3f} / "
                  f"{m['vgg'][j].mean():.3f} / {m['psnr'][j].mean():.2f} / {m['ssim'][j].mean():.3f} | "
                  f"{b['alex'][j].mean():.3f} / {b['psnr'][j].mean():.2f} / {b['ssim'][j].mean():.3f} | "
                  f"{collapsed[j].sum()}/{len(j)} |")
        for other in framings[1:]:
            a = [idx[(i, framings[0])] for i in keep]
            o = [idx[(i, other)] for i in keep]
            for t in ("alex", "vgg"):
                wins = (score["raw"][t][a] < score["raw"][t][o]).mean()
                won = (score["matched"][t][a] < score["matched"][t][o]).mean()
                print(f"\n{framings[0]} better than {other} by ST-LPIPS {t} on {wins:.0%} of {len(keep)} faces "
                      f"({'+'.join(s)}; matched outputs: {won:.0%})", end="")
        print()


ood = [("lfw",), ("astronaut",), ("portraits",), ("reframed",), ("lfw", "astronaut", "portraits", "reframed")]
table(ood, ["aligned", "centre", "cascade"], "Out-of-distribution framing: aligned vs centre square vs cascade square")
if args.reframed:
    # the reframed faces' training framing is known: does framing them exactly as training did
    # beat the centre square more often than the detected alignment does?
    table([("reframed",)], ["ideal", "centre", "aligned"], "Reframed CelebA faces: the exact training framing (ideal) vs centre square and aligned")
    print("\n| centre square's zoom out (its face this many times smaller than the training framing's) | faces | aligned better than centre (alex) | ideal better than centre (alex) |")
    print("|---|---|---|---|")
    ref = [i for i, r in enumerate(rows) if r["set"] == "reframed" and (i, "aligned") in idx]
    zoom = np.array([rows[i]["zoom out"] for i in ref])
    a = score["raw"]["alex"]
    for lo, hi in ((1.0, 1.6), (1.6, 2.2), (2.2, 10.0)):
        sel = [i for i, z in zip(ref, zoom) if lo <= z < hi]
        if sel:
            won = np.mean([a[idx[(i, "aligned")]] < a[idx[(i, "centre")]] for i in sel])
            won_ideal = np.mean([a[idx[(i, "ideal")]] < a[idx[(i, "centre")]] for i in sel])
            print(f"| {lo:.1f}-{hi:.1f}x | {len(sel)} | {won:.0%} | {won_ideal:.0%} |")
if args.celeba:
    table([("celeba",)], ["aligned", "paper-crop"], "Held-out CelebA photos as they are: aligned vs the paper's crop")
missed = [r["name"] for r in rows if r["aligned"] is None]
print(f"\nno face found (aligned row left out): {missed}")

# ---------------------------------------------------------------- detection time on large photos
print("\n## Detection + alignment time\n")
print("| photo | read s | detect + align s | faces | decode one face (exact, batch 1) s |")
print("|---|---|---|---|---|")
one = time.perf_counter()
up.decode(rows[-1]["face"].lr[None] if rows[-1]["face"] else lr[:1], opts)
one = time.perf_counter() - one
tmp = Path(tempfile.mkdtemp())  # the test photos are written and read back, not kept
astro = Image.fromarray(skimage.data.astronaut())
for w, h in ((4000, 3000), (8000, 6000)):
    canvas = Image.new("RGB", (w, h), (120, 130, 110))
    face = astro.resize((w // 5, w // 5), Image.Resampling.BICUBIC)
    canvas.paste(face, (w // 3, h // 4))
    path = tmp / f"face-alignment-{w}x{h}.jpg"
    canvas.save(path, quality=90)
    t = time.perf_counter()
    img = open_rgb(path)
    t_read = time.perf_counter() - t
    t = time.perf_counter()
    found, _ = F.faces_of(img)
    t_det = time.perf_counter() - t
    path.unlink()
    print(f"| {w}x{h} ({w * h / 1e6:.0f} MP) JPEG | {t_read:.2f} | {t_det:.2f} | {len(found)} | {one:.2f} |")

# ---------------------------------------------------------------- pictures for docs/faces.md
out_dir = Path(args.figures)
out_dir.mkdir(parents=True, exist_ok=True)
# LFW faces and the astronaut only: no CelebA pixels go into the docs
show = [i for i, r in enumerate(rows) if r["set"] in ("lfw", "astronaut") and r["aligned"] is not None]
show = [i for i in show if rows[i]["set"] == "lfw"][:7] + [i for i in show if rows[i]["set"] == "astronaut"]
gap = np.full((32 * 4, 4, 3), 255, np.uint8)


def big(x):
    return np.repeat(np.repeat(np.asarray(x), 4, 0), 4, 1)


lines = []
for i in show:
    r = rows[i]
    thumb = np.asarray(r["img"].resize((128, 128), Image.Resampling.BICUBIC))
    parts = [thumb, gap]
    for fr in ("centre", "aligned"):
        j = idx[(i, fr)]
        parts += [big(np.repeat(np.repeat(lr[j], 4, 0), 4, 1)), big(matched[j]), big(real[j]), gap]
    lines.append(np.concatenate(parts[:-1], 1))
grid = np.concatenate([x for l in lines for x in (l, np.full((4, l.shape[1], 3), 255, np.uint8))][:-1], 0)
Image.fromarray(grid).save(out_dir / "faces-grid.png")
print(f"\nfigure: {out_dir / 'faces-grid.png'} ({len(show)} faces)")
