# End-to-end speed of the batch command (`sr-blockwise upscale`, model loading excluded, the first
# batch's warm-up included) by mode, k, dtype and batch size, with the shipped default weights and
# the default input guidance, on held-out test faces' 8x8 inputs: 4 faces at batch 1, the same 64
# at batch 8, 16, 32 and 64 (docs/upscale.md, "Speed"; the default --batch-size).
#   .venv/bin/python experiments/batch-speed/upscale_speed.py [--modes greedy,exact,approx] [--k 2,4,6] [--dtypes bfloat16]
# Log: upscale_speed.log beside this script.
import argparse, json, subprocess, sys, tempfile
from pathlib import Path
from PIL import Image
from sr_blockwise.data import downsample_8, load_faces

p = argparse.ArgumentParser()
p.add_argument("--modes", default="greedy,exact,approx")
p.add_argument("--k", default="2,4,6")
p.add_argument("--dtypes", default="bfloat16")
p.add_argument("--batches", default="1:4,8:64,16:64,32:64,64:64", help="batch size:faces")
a = p.parse_args()
tmp = Path(tempfile.mkdtemp(prefix="upscale-speed-"))
lr = downsample_8(load_faces(part="test").images[:64])
exe = str(Path(sys.executable).with_name("sr-blockwise"))
print("| mode | k | dtype | batch | faces | images/s | s/image | mean block |\n|---|---|---|---|---|---|---|---|", flush=True)
for bs, n in (map(int, b.split(":")) for b in a.batches.split(",")):
    src = tmp / f"in-{n}"
    src.mkdir(exist_ok=True)
    for i, img in enumerate(lr[:n]):
        Image.fromarray(img).save(src / f"{i:03d}.png")
    for mode, k in [(m, int(k)) for m in a.modes.split(",") for k in (a.k.split(",") if m != "greedy" else ["1"])]:
        for dt in a.dtypes.split(","):
            out, metrics = tmp / f"out-{mode}-{k}-{dt}-{bs}", tmp / f"{mode}-{k}-{dt}-{bs}.json"
            subprocess.run([exe, "upscale", str(src), "-o", str(out), "--mode", mode, "--k", str(k),
                            "--batch-size", str(bs), "--dtype", dt, "--threads", "2", "--quiet",
                            "--metrics", str(metrics)], check=True)
            s = json.loads(metrics.read_text())["summary"]
            mb = f"{s['mean_block']:.2f}" if mode != "greedy" and s["mean_block"] else "1"
            print(f"| {mode} | {k} | {dt} | {bs} | {s['done']} | {s['done'] / s['seconds']:.2f} | "
                  f"{s['seconds'] / s['done']:.3f} | {mb} |", flush=True)
