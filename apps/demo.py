"""`sr-blockwise demo`: a Gradio page that upscales a face 8x8 -> 32x32 live, exact and
approximate blockwise decoding side by side.

The weights load through sr_blockwise.api.Upscaler, as the batch command's and the Python API's
do. Every input goes through sr_blockwise.data's open_rgb and image_to_input (the crop + area
downsample of the batch command and the API; large photos are read at reduced size), optionally
cropped to a detected face first; decoding is sr_blockwise.decoding.decode, the API's decoder,
run in a worker thread whose progress callback hands frames to a Gradio generator. The page is
fully offline: no analytics, fonts or assets from the internet.
"""
import os

# before gradio is imported anywhere: no usage analytics, no calls to the Hugging Face hub
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import queue
import threading
import time
import traceback
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

from sr_blockwise.data import (DEFAULT_DATA, BadImage, bicubic_upscale, from_tokens, image_to_input,
                               match_input, open_rgb)

GREEDY_CALLS = 3072  # = sr_blockwise.model.SEQ_LEN (greedy: one call per intensity); not imported: it loads torch
CROPS = ("centre square", "detect face")
FILL = 220  # intensity shown for tokens not decoded yet (light grey)
# viridis, 5 stops: block map colours from 1 token per call (dark) to k (yellow)
VIRIDIS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], float)


# ---------------------------------------------------------------- inputs

@dataclass
class Prepared:
    lr: np.ndarray  # (8, 8, 3) uint8: what the model sees
    face: np.ndarray | None  # (32, 32, 3) uint8: the real 32x32 when the input had one
    note: str  # how the input was made, for the page
    info: dict


@lru_cache(maxsize=1)
def _face_cascade():
    import skimage.data
    from skimage.feature import Cascade
    return Cascade(skimage.data.lbp_frontal_face_cascade_filename())


def detect_face_square(img: Image.Image) -> Image.Image | None:
    """The largest face skimage's LBP cascade finds, as a square grown 1.5x about the face box (about
    the framing of CelebA's crop); None when no face is found."""
    scale = min(1.0, 512 / max(img.size))  # detect on a small copy: fast on any photo
    small = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))),
                       Image.Resampling.BOX) if scale < 1 else img
    side_max = min(small.size)
    if side_max < 24:
        return None
    faces = _face_cascade().detect_multi_scale(img=np.asarray(small), scale_factor=1.2, step_ratio=1,
                                               min_size=(24, 24), max_size=(side_max, side_max))
    if not faces:
        return None
    f = max(faces, key=lambda f: f["width"] * f["height"])
    cx, cy = (f["c"] + f["width"] / 2) / scale, (f["r"] + f["height"] / 2) / scale
    side = min(1.5 * f["width"] / scale, img.width, img.height)
    left = min(max(cx - side / 2, 0), img.width - side)  # shift the square inside the photo
    top = min(max(cy - side / 2, 0), img.height - side)
    return img.crop((round(left), round(top), round(left + side), round(top + side)))


def prepare_input(path: str | Path, crop: str = "centre square") -> Prepared:
    """An uploaded file -> the 8x8 input (and the real 32x32 when there is one).
    Raises BadImage with a message naming the file (never the server's temp path)."""
    name = Path(path).name
    try:
        img = open_rgb(str(path))
    except BadImage as e:
        raise BadImage(str(e).replace(str(path), name)) from None
    w, h = img.info.get("full_size", img.size)  # a large photo is read at reduced size
    info = {"file": name, "size": [w, h], "crop": crop}
    if (w, h) == (8, 8):
        note = "8x8 image: used as is"
    elif (w, h) == (32, 32):
        note = "32x32 image: taken as the face, area-downsampled to 8x8"
    elif crop == "detect face" and (sq := detect_face_square(img)) is not None:
        side = round(sq.width * w / img.width)  # in the photo's own pixels
        img = sq
        note = f"{w}x{h} photo: detected face, {side}x{side} square, area-downsampled to 32x32 and 8x8"
    else:
        how = "CelebA crop" if (w, h) == (178, 218) else "centre square"
        if crop == "detect face":
            how = "no face found, " + how
        note = f"{w}x{h} photo: {how}, area-downsampled to 32x32 and 8x8"
    info["note"] = note
    lr, face = image_to_input(img)  # the shared crop + downsample
    return Prepared(lr, face, note, info)


# ---------------------------------------------------------------- live decoding

@dataclass
class Frame:
    tokens: np.ndarray  # (3072,) decoded so far (positions >= done are not decoded yet)
    done: int
    block_map: np.ndarray  # (3072,) accepted block length per decoded token
    calls: int
    seconds: float


# The demo decodes in worker threads, where OpenMP teams outnumber the cores and libgomp stops
# spinning between parallel regions: there 2 torch threads ran several times slower than 1 (the
# native engine runs on 1 thread outside the main thread for the same reason, engine.py). So
# `sr-blockwise demo` sets 1 torch thread at start-up (--threads) for what runs in PyTorch
# (sampling): torch.set_num_threads sets the calling thread's count and the count every thread
# started later begins with, so every worker gets it.
DECODE_THREADS = 1


def page_defaults(model) -> tuple[int, int, float]:
    """The page's starting k, eps and input guidance for this model: guidance 1 for weights
    without the learned input prior."""
    from sr_blockwise.decoding import default_prior_weight
    return min(6, model.cfg.n_blockwise), 2, default_prior_weight(model)


class Cancelled(Exception):
    pass


def decode_live(model, lr, opts, progress_every: int = 8, min_interval: float = 0.25,
                time_limit: float | None = None):
    """Decode one 8x8 input in a worker thread; yield Frames (at most one per min_interval
    seconds, always the newest) and finally the DecodeResult. Closing the generator (the user
    left) or passing time_limit stops the worker at its next progress call."""
    from sr_blockwise.decoding import DecodeResult, decode

    q: queue.Queue = queue.Queue()
    stop = threading.Event()
    t0 = time.perf_counter()

    def progress(tokens, done, bmap, calls):
        if stop.is_set():
            raise Cancelled()
        q.put(Frame(tokens[0], int(done[0]), bmap[0], int(calls), time.perf_counter() - t0))

    def work():
        try:
            q.put(decode(model, lr[None], opts, progress=progress, progress_every=progress_every))
        except BaseException as e:  # handed to the consumer, which raises it
            q.put(e)

    threading.Thread(target=work, name="sr-blockwise-decode", daemon=True).start()
    last = 0.0
    try:
        while True:
            try:
                item = q.get(timeout=1.0)
            except queue.Empty:
                item = None
            while isinstance(item, Frame) and not q.empty():  # only the newest frame matters
                item = q.get_nowait()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, DecodeResult):
                yield item
                return
            if time_limit is not None and time.perf_counter() - t0 > time_limit:
                raise TimeoutError(f"decoding took more than {time_limit:.0f} s; the server is busy, "
                                   "try again later")
            if item is not None and time.perf_counter() - last >= min_interval:
                last = time.perf_counter()
                yield item
    finally:
        stop.set()


def partial_image(tokens: np.ndarray, done: int) -> np.ndarray:
    t = np.full(GREEDY_CALLS, FILL, np.uint8)
    t[:done] = tokens[:done]
    return from_tokens(t)


def block_map_image(block_map: np.ndarray, done: int, k: int) -> np.ndarray:
    """(3072,) accepted block lengths -> (32, 32, 3) colours: each pixel the mean over its decoded
    channels of (length - 1) / (k - 1) on viridis; undecoded pixels light grey."""
    x = (np.asarray(block_map, float) - 1) / max(1, k - 1)
    decoded = (np.arange(GREEDY_CALLS) < done).reshape(32, 32, 3)
    x = x.reshape(32, 32, 3)
    n = decoded.sum(-1)
    v = np.clip((x * decoded).sum(-1) / np.maximum(n, 1), 0, 1) * (len(VIRIDIS) - 1)
    i = np.minimum(v.astype(int), len(VIRIDIS) - 2)
    f = (v - i)[..., None]
    rgb = VIRIDIS[i] * (1 - f) + VIRIDIS[i + 1] * f
    rgb[n == 0] = FILL
    return np.round(rgb).astype(np.uint8)


# ---------------------------------------------------------------- stats

TITLES = {"exact": "Exact", "approx": "Approximate", "greedy": "Greedy", "sample": "Sample"}


def mode_label(mode: str, opts) -> str:
    if mode == "greedy":
        return "Greedy (k=1)"
    if mode == "exact":
        return f"Exact (k={opts.k})"
    if mode == "sample":
        how = "speculative, " if opts.k > 1 else ""
        return f"Sample ({how}k={opts.k}, T={opts.temperature:g}, seed {opts.seed})"
    return f"Approximate (k={opts.k}, eps={opts.eps})"


def running_markdown(mode: str, opts, fr: Frame) -> str:
    steps = max(1, fr.calls - 1)  # the first call only proposes; every later one accepts a block
    return (f"**{mode_label(mode, opts)}**: decoding... {fr.done:,} / {GREEDY_CALLS:,} intensities\n\n"
            f"model calls **{fr.calls:,}** (greedy: 1 per intensity) → **{fr.done / fr.calls:.1f}x fewer** "
            f"so far · mean block **{fr.done / steps:.2f}** · **{fr.seconds:.2f} s**")


def result_stats(mode: str, opts, res) -> dict:
    st = res.stats[0]
    return {"mode": mode, "k": opts.k, "rule": opts.rule, "eps": opts.eps, "temperature": opts.temperature,
            "seed": opts.seed if opts.temperature else None, "calls": st.calls,
            "greedy_calls": GREEDY_CALLS, "speedup_calls": GREEDY_CALLS / st.calls,
            "mean_block": st.mean_block, "block_hist": st.block_hist, "seconds": st.seconds}


def final_markdown(mode: str, opts, s: dict) -> str:
    lines = [f"**{mode_label(mode, opts)}**: done",
             f"model calls **{s['calls']:,}** (greedy: {GREEDY_CALLS:,}) → **{s['speedup_calls']:.1f}x fewer** · "
             f"mean block **{s['mean_block']:.2f}** · **{s['seconds']:.2f} s**"]
    if "speedup_wall" in s:
        lines.append(f"wall clock vs greedy run here: **{s['speedup_wall']:.1f}x**")
    if "identical_to_greedy" in s:
        lines.append("identical to greedy: **" + ("yes" if s["identical_to_greedy"] else "no") + "**")
    if "differs_from_exact" in s:
        lines.append(f"differs from exact on {s['differs_from_exact']:,} of {GREEDY_CALLS:,} intensities "
                     f"(max |diff| {s['max_abs_diff_vs_exact']})")
    return "\n\n".join(lines)


def compare(stats: dict, images: dict) -> None:
    """Add cross-mode facts to the stats: approx vs exact, and wall-clock speedup where greedy ran."""
    if "approx" in images and "exact" in images:
        d = np.abs(images["approx"].astype(int) - images["exact"].astype(int))
        stats["approx"]["differs_from_exact"] = int((d > 0).sum())
        stats["approx"]["max_abs_diff_vs_exact"] = int(d.max())
    if "greedy" in images:
        for m in ("exact", "approx"):
            if m in stats:
                stats[m]["speedup_wall"] = stats["greedy"]["seconds"] / max(stats[m]["seconds"], 1e-9)
        if "exact" in images:
            stats["exact"]["identical_to_greedy"] = bool((images["exact"] == images["greedy"]).all())


# ---------------------------------------------------------------- the page

CSS = """
.pixelated img { image-rendering: pixelated; width: 100%; height: 100%; object-fit: contain; }
.examples img { image-rendering: pixelated; }
.legend { display: inline-block; width: 160px; height: 10px; border-radius: 3px; vertical-align: middle;
  background: linear-gradient(to right, #440154, #3b528b, #21918c, #5ec962, #fde725); }
"""

INTRO = """# sr-blockwise: 8x8 → 32x32 faces, decoded live
An Image Transformer writes the 32x32 face one intensity at a time (3,072 of them). Blockwise
parallel decoding (Stern et al. 2018) lets extra heads propose **k** intensities at once and keeps
the longest run the model agrees with: **exact** mode gives the greedy image in fewer model
calls; **approximate** mode also accepts proposals within **eps** levels, for bigger blocks;
**sample** draws a random face by speculative sampling: the heads' sampled proposals are kept
or redrawn so that the face is a true sample of the model, in fewer calls."""

MAP_HELP = """Block maps colour each pixel by the length of the blocks its intensities were accepted in:
1 per call (as greedy) <span class="legend"></span> k per call; grey: not decoded yet."""


def build_app(model, weights_name: str, examples: list | None = None, celeba: list | None = None,
              progress_every: int = 8, time_limit: float | None = 300.0, example_dir: str | None = None):
    """The Gradio Blocks for a loaded model. examples / celeba: lists of apps.examples.Example."""
    import tempfile

    import gradio as gr

    from sr_blockwise.decoding import options_for

    from .examples import write_examples

    K = model.cfg.n_blockwise
    k0, eps0, w0 = page_defaults(model)
    examples, celeba = examples or [], celeba or []
    example_dir = example_dir or tempfile.mkdtemp(prefix="sr-blockwise-demo-")
    ex_paths = write_examples(examples, Path(example_dir) / "builtin")
    cb_paths = write_examples(celeba, Path(example_dir) / "celeba")

    def user_input(path, crop) -> Prepared:
        if not path:
            raise gr.Error("Upload a photo or pick an example first.", title="No input", print_exception=False)
        try:
            return prepare_input(path, crop)
        except BadImage as e:
            raise gr.Error(str(e), title="Not a usable image", print_exception=False) from None

    def preview(path, crop):
        if not path:
            return None, None, ""
        p = user_input(path, crop)
        return p.lr, p.face, p.note

    def small_image(label, elem_id, height=200):
        # 32x32 PNGs (downloads stay 32x32), shown enlarged with pixelated rendering by the CSS
        return gr.Image(label=label, format="png", height=height, interactive=False, elem_id=elem_id,
                        elem_classes="pixelated", buttons=["download"])

    # delete_cache: streamed frames are files in gradio's cache; drop those older than an hour
    with gr.Blocks(title="sr-blockwise demo", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(INTRO)
        with gr.Row():
            with gr.Column(scale=3):
                photo = gr.File(label="Photo (JPEG, PNG, WebP, BMP; any size) or an 8x8 image",
                                file_count="single", type="filepath", elem_id="photo", height=110)
                ex_gallery = gr.Gallery([(p, e.caption) for p, e in zip(ex_paths, examples)],
                                        label="Built-in examples (click one)", columns=7, height=125,
                                        allow_preview=False, format="png", elem_classes="examples",
                                        buttons=[], visible=bool(ex_paths))
                cb_gallery = gr.Gallery([(p, e.caption) for p, e in zip(cb_paths, celeba)],
                                        label="Held-out CelebA faces (click one; the real 32x32 is shown "
                                              "beside the output)", columns=8, height=125, allow_preview=False,
                                        format="png", elem_classes="examples", buttons=[],
                                        visible=bool(cb_paths))
            with gr.Column(scale=2):
                lr_img = small_image("8x8: what the model sees", "lr", height=190)
                note = gr.Markdown(elem_id="note")
                crop = gr.Radio(list(CROPS), value=CROPS[0], label="Crop larger photos to",
                                info="the model saw CelebA-framed faces in training")
        with gr.Row():
            k = gr.Slider(1, K, value=k0, step=1, label="k: block size",
                          info=f"intensities proposed per model call (1 = greedy; this model has {K} heads)")
            eps = gr.Slider(0, 32, value=eps0, step=1, label="eps: tolerance (approximate mode)",
                            info="accept a proposal within eps intensity levels of the model's own choice")
            with_greedy = gr.Checkbox(False, label="also run greedy",
                                      info="3,072 model calls: slow, but measures the wall-clock speedup")
            with_sample = gr.Checkbox(False, label="also sample", elem_id="with-sample",
                                      info="a random face from the model at this temperature (k > 1: "
                                           "speculative sampling, the same distribution in fewer calls)")
            match = gr.Checkbox(True, label="match the 8x8 input", elem_id="match",
                                info="shift each 4x4 block's colour so that it averages to its input pixel "
                                     "(back-projection): fixes colour drift and collapsed patches; "
                                     "off: the decoder's own output")
            guidance = gr.Slider(0, 8, value=w0, step=0.5, label="input guidance",
                                 elem_id="guidance",
                                 info="weight of the model's learned pull toward the 8x8 input's own "
                                      "colours (1: as trained; higher: closer to the input, longer "
                                      "blocks; very high: a blocky upscale)")
            temperature = gr.Slider(0.1, 1.5, value=0.8, step=0.05, label="temperature (sample)",
                                    elem_id="temperature",
                                    info="1: the model's own distribution; lower: safer, smoother faces")
            seed = gr.Number(0, precision=0, minimum=0, label="seed (sample)", elem_id="seed",
                             info="the same seed and settings give the same face")
        go = gr.Button("Upscale", variant="primary", elem_id="go")
        status = gr.Markdown(elem_id="status")
        with gr.Row(equal_height=False):
            bicubic_img = small_image("Bicubic", "bicubic")
            cols, outs = {}, {}
            for mode in ("exact", "approx", "greedy", "sample"):
                with gr.Column(min_width=160, visible=mode in ("exact", "approx")) as col:
                    img = small_image(TITLES[mode], f"out-{mode}")
                    bmap = small_image(f"{TITLES[mode]}: block map", f"map-{mode}", height=120)
                    md = gr.Markdown(elem_id=f"stats-{mode}")
                cols[mode], outs[mode] = col, (img, bmap, md)
            real_img = small_image("Real 32x32 (the crop)", "real")
        gr.Markdown(MAP_HELP)
        with gr.Accordion("All numbers (JSON)", open=False):
            stats_json = gr.JSON(elem_id="stats-json")
        gr.Markdown(f"Weights: `{weights_name}` ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
                    "parameters). Everything runs on this server; nothing is sent anywhere else.")

        all_outputs = [lr_img, real_img, note, bicubic_img, status,
                       *[c for m in outs for c in outs[m]], stats_json]

        def upscale(path, crop_how, k_val, eps_val, greedy_too, match_8x8=True, prior_w=w0,
                    sample_too=False, temp=0.8, seed_val=0):
            p = user_input(path, crop_how)
            k_val, eps_val, prior_w, temp, seed_val = int(k_val), int(eps_val), float(prior_w), float(temp), int(seed_val or 0)
            if sample_too and not temp > 0:
                raise gr.Error("The temperature must be above 0 to sample.", title="Bad setting", print_exception=False)
            modes = ["exact", "approx"] + (["greedy"] if greedy_too else []) + (["sample"] if sample_too else [])

            def mode_options(mode):
                return options_for(mode, k_val, eps_val, temperature=temp, seed=seed_val, prior_weight=prior_w)
            stats = {"weights": weights_name, "input": p.info, "match_input": bool(match_8x8),
                     "prior_weight": prior_w}
            images = {}  # as shown (matched or not): the stats compare what the page shows
            blank = np.full((32, 32, 3), FILL, np.uint8)
            view = {lr_img: p.lr, real_img: p.face, note: p.note, bicubic_img: bicubic_upscale(p.lr),
                    status: "", stats_json: None}
            for m in outs:
                view.update({outs[m][0]: blank if m in modes else None, outs[m][1]: None,
                             outs[m][2]: "waiting..." if m in modes else ""})
            yield dict(view)
            # the modes decode one after another, not at once: on a CPU their timings stay honest
            for mode in modes:
                opts = mode_options(mode)
                img, bmap, md = outs[mode]
                try:
                    for item in decode_live(model, p.lr, opts, progress_every, time_limit=time_limit):
                        if isinstance(item, Frame):
                            yield {img: partial_image(item.tokens, item.done),
                                   bmap: block_map_image(item.block_map, item.done, opts.k),
                                   md: running_markdown(mode, opts, item)}
                            continue
                        stats[mode] = result_stats(mode, opts, item)
                        shown = match_input(item.images[0], p.lr) if match_8x8 else item.images[0]
                        images[mode] = shown
                        view.update({img: shown,
                                     bmap: block_map_image(item.block_map[0], GREEDY_CALLS, opts.k),
                                     md: final_markdown(mode, opts, stats[mode])})
                        yield {img: view[img], bmap: view[bmap], md: view[md]}
                except TimeoutError as e:
                    raise gr.Error(str(e), title="Server busy", print_exception=False) from None
                except Exception as e:  # a bug: the traceback goes to the server log, one line to the page
                    traceback.print_exc()
                    raise gr.Error(f"decoding failed: {type(e).__name__}: {e}", title="Decoding failed",
                                   print_exception=False) from None
            compare(stats, images)
            for mode in modes:
                view[outs[mode][2]] = final_markdown(mode, mode_options(mode), stats[mode])
            view[status] = "Done: " + ", ".join(f"{m} {stats[m]['seconds']:.2f} s" for m in modes) + "."
            view[stats_json] = stats
            yield view

        # progress, queue position and errors show on one small status line, not on every image
        photo.change(preview, [photo, crop], [lr_img, real_img, note], api_name="preview",
                     concurrency_limit=4, show_progress="minimal", show_progress_on=[note])
        crop.change(preview, [photo, crop], [lr_img, real_img, note], api_visibility="private",
                    concurrency_limit=4, show_progress="minimal", show_progress_on=[note])

        def picker(paths):
            def pick(evt: gr.SelectData):  # gradio passes the click by this annotation
                return paths[evt.index]
            return pick

        ex_gallery.select(picker(ex_paths), None, photo, api_visibility="private", queue=False)
        cb_gallery.select(picker(cb_paths), None, photo, api_visibility="private", queue=False)
        for box, mode in ((with_greedy, "greedy"), (with_sample, "sample")):  # the optional columns
            box.change(lambda v: gr.Column(visible=v), box, cols[mode], api_visibility="private", queue=False)
        # one decode at a time, first come first served (the queue is bounded in launch): on a
        # few CPU cores parallel decodes would only slow each other down
        go.click(upscale, [photo, crop, k, eps, with_greedy, match, guidance, with_sample, temperature, seed],
                 all_outputs, api_name="upscale",
                 concurrency_limit=1, concurrency_id="decode", show_progress="full",
                 show_progress_on=[status])
    demo.example_dir = example_dir
    return demo


def launch(demo, host="127.0.0.1", port=7860, share=False, max_queue=16, prevent_thread_lock=False,
           quiet=False):
    """Start the server; queue limits keep several users fairly served (FIFO, bounded)."""
    demo.queue(max_size=max_queue, default_concurrency_limit=1)
    return demo.launch(server_name=host, server_port=port, share=share, css=CSS,
                       prevent_thread_lock=prevent_thread_lock, quiet=quiet, show_error=False,
                       max_file_size="64mb", allowed_paths=[demo.example_dir], ssr_mode=False,
                       mcp_server=False, pwa=False, footer_links=["api", "settings"])


# ---------------------------------------------------------------- command line

def cmd_demo(args) -> int:
    import torch

    from sr_blockwise.api import Upscaler
    from sr_blockwise.checkpoints import WeightsError

    from .examples import builtin_examples, celeba_examples

    try:  # on the CPU: the page decodes one image at a time, live
        up = Upscaler(args.weights, device="cpu", dtype=args.dtype)
    except WeightsError as e:  # the CLI prints ValueErrors as one line
        raise WeightsError(f"{e}. Pass --weights with a weights name, a .json path or a training "
                           "checkpoint .pt") from None
    model, name = up.model, up.weights
    if args.threads:  # before any worker thread starts: each begins with this count (DECODE_THREADS)
        torch.set_num_threads(args.threads)
    from sr_blockwise import engine
    if not engine.available():  # built here, once, rather than in the first user's decode
        print("sr-blockwise demo: the native decoding engine is not available; decoding with PyTorch")
    data = args.data or DEFAULT_DATA / "celeba32.npz"
    if not args.no_celeba and Path(data).exists():
        print(f"sr-blockwise demo: reading held-out CelebA faces from {data}")
    celeba = [] if args.no_celeba else celeba_examples(data)
    if args.data and not celeba:
        print(f"sr-blockwise demo: no CelebA faces at {args.data}; showing built-in examples only")
    demo = build_app(model, Path(str(name)).stem, builtin_examples(), celeba, time_limit=args.time_limit)
    print(f"sr-blockwise demo: weights {name}, {len(celeba)} held-out CelebA examples; "
          f"serving on http://{args.host}:{args.port}")
    launch(demo, args.host, args.port, args.share, args.max_queue)
    return 0


def register(subparsers) -> None:
    d = subparsers.add_parser("demo", help="serve the live upscaling web demo (Gradio)",
                              description="Serve the Gradio demo: exact and approximate blockwise "
                                          "decoding side by side, live.")
    d.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 to serve a network)")
    d.add_argument("--port", type=int, default=7860)
    d.add_argument("--weights", default=None, help="weights name in weights/ or a .json/.pt path "
                                                   "(default: the shipped default)")
    d.add_argument("--share", action="store_true", help="also open a public gradio.live link (needs internet)")
    d.add_argument("--data", default=None, help="CelebA .npz or folder whose held-out faces to offer "
                                                "(default: the configured data path, if it exists)")
    d.add_argument("--no-celeba", action="store_true", help="offer the built-in examples only")
    d.add_argument("--max-queue", type=int, default=16, help="waiting requests beyond this are refused")
    d.add_argument("--time-limit", type=float, default=300.0, help="seconds one decode may take")
    d.add_argument("--threads", type=int, default=DECODE_THREADS,
                   help="torch CPU threads of a sampling decode (0: torch's default). 1 by default: the demo "
                        "decodes in worker threads, where 2 threads ran several times slower than 1 on a "
                        "2-core machine (the native engine uses 1 thread there whatever this says)")
    d.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="the weights' dtype: the native engine computes in float32 with them, sampling "
                        "runs in PyTorch in this dtype")
    d.set_defaults(func=cmd_demo)
