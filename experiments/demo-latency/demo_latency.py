# Where the demo's time goes at batch 1: the same face decoded (a) by the library alone on the main
# thread, (b) through apps.demo.decode_live in-process (the worker thread + live frames every 8
# calls, no server), (c) through the real Gradio server's /upscale API (gradio_client, no browser),
# each with the decode at 2 torch threads and at 1. The apps' exact and approximate modes
# (decoding.options_for: exact recycles proposals, approx proposes window centres, eps 2) at k=6
# or --k, input guidance 2, the weights in --dtype (default: the demo's, api.DEFAULT_DTYPE).
#   .venv/bin/python experiments/demo-latency/demo_latency.py [--repeats 2] [--k K] [--dtype D]
# Logs beside this script: demo_latency.log (k=6), demo_latency_k2.log and demo_latency_k4.log
# (--dtype float32), demo_latency_k4_bfloat16.log and demo_latency_k4_float32_again.log (the two
# run one after the other).
import argparse, os, socket, time
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False"); os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from PIL import Image
from sr_blockwise.api import DEFAULT_DTYPE, torch_dtype
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode, options_for
from apps.demo import build_app, decode_live, launch

p = argparse.ArgumentParser()
p.add_argument("--repeats", type=int, default=2)
p.add_argument("--threads", default="2,1", help="torch threads of the decode to compare")
p.add_argument("--server-only", action="store_true")
p.add_argument("--k", type=int, default=6, help="block size of both decodes (the page starts at 4)")
p.add_argument("--dtype", default=DEFAULT_DTYPE, choices=["bfloat16", "float32"])
a = p.parse_args()
THREADS = [int(n) for n in a.threads.split(",")]
model = load_model("cpu-finetuned", dtype=torch_dtype(a.dtype))
face = load_faces(part="test").images[1]
lr = downsample_8(face[None])[0]
import tempfile
path = os.path.join(tempfile.mkdtemp(), "demo_latency_face.png")
Image.fromarray(face).save(path)
W, K, EPS = 2.0, a.k, 2
rows = []
decode(model, lr[None], options_for("approx", K, EPS, prior_weight=W))  # warm-up
for rep in range(0 if a.server_only else a.repeats):
    for mode in ("exact", "approx"):
        o = options_for(mode, K, EPS, prior_weight=W)
        for n in THREADS:
            torch.set_num_threads(n)
            rows.append(("library (main thread)", mode, n, decode(model, lr[None], o).seconds))
        for n in THREADS:
            torch.set_num_threads(n)  # the worker thread decode_live starts begins with n
            t0 = time.perf_counter()
            for item in decode_live(model, lr, o, 8):
                pass
            rows.append(("decode_live (worker thread)", mode, n, time.perf_counter() - t0))

from gradio_client import Client, handle_file
for n in THREADS:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    torch.set_num_threads(n)  # before the server's threads start, as `sr-blockwise demo --threads` does
    demo = build_app(model, "cpu-finetuned")
    launch(demo, port=port, prevent_thread_lock=True, quiet=True)
    client = Client(f"http://127.0.0.1:{port}/", verbose=False, analytics_enabled=False, download_files=False)
    for rep in range(a.repeats + 1):
        t0 = time.perf_counter()
        stats = client.predict(handle_file(path), "", K, EPS, False, True, W, api_name="/upscale")[-2]  # the JSON of numbers
        wall = time.perf_counter() - t0
        if rep:  # the first call warms the server up
            for mode in ("exact", "approx"):
                rows.append(("server", mode, n, stats[mode]["seconds"]))
            rows.append(("server", "both, client wall", n, wall))
    demo.close()

print("| path | mode | torch threads | seconds (each repeat) |\n|---|---|---|---|")
seen = {}
for path_, mode, n, sec in rows:
    seen.setdefault((path_, mode, n), []).append(sec)
for (path_, mode, n), secs in sorted(seen.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
    print(f"| {path_} | {mode} | {n} | {' / '.join(f'{s:.2f}' for s in secs)} |")
