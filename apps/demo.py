"""The Gradio page of `sr-blockwise demo` (sr_blockwise/cli/demo.py): it upscales a face 8x8 ->
32x32 live, exact and approximate blockwise decoding side by side.

This file only draws the page (layout), answers its events (the handlers) and connects the two
(wire). The weights load through sr_blockwise.api.Upscaler; a photo's faces (found and aligned to
the training framing, or boxed by hand by two clicks on the photo) and live decoding come from
sr_blockwise.serving.live, the batch command's and the API's faces and decoder; the decodes of many users
at once share sr_blockwise.serving.service's decode service, which the HTTP API (sr_blockwise.serving.webapi,
mounted on the same server) uses too. The page is fully offline: no analytics, fonts or assets
from the internet.
"""
import os

# before gradio is imported: no usage analytics, no calls to the Hugging Face hub
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tempfile
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import numpy as np

from sr_blockwise.data import BadImage, bicubic_upscale, match_input
from sr_blockwise.decoding import DEFAULT_GUARD, options_per_mode
from sr_blockwise.examples import write_examples
from sr_blockwise.faces import DetectorMissing
from sr_blockwise.serving.live import (FILL, GREEDY_CALLS, TITLES, Frame, Prepared, block_map_image, compare,
                               final_markdown, page_defaults, partial_image, pasted_view, photo_view,
                               prepare_input, read_photo, result_stats, running_markdown, view_to_photo)
from sr_blockwise.serving.service import Busy, DecodeService
from sr_blockwise.serving.webapi import Upscaling, make_api

UPLOAD_MB = 64  # the largest upload the page and the HTTP API take
PAGE_REQUESTS = 32  # the page's upscale requests served at once (their decodes batched)
COLUMN_MODES = ("exact", "approx", "greedy", "sample")  # the modes' result columns, left to right
CSS = """
.pixelated img { image-rendering: pixelated; width: 100%; height: 100%; object-fit: contain; }
.examples img { image-rendering: pixelated; }
/* one face takes a sixth of the row, not all of it; below the label, which overlaps the first row */
#faces .grid-container { grid-template-columns: repeat(6, minmax(0, 1fr)) !important; margin-top: 28px; }
.legend { display: inline-block; width: 160px; height: 10px; border-radius: 3px; vertical-align: middle;
  background: linear-gradient(to right, #440154, #3b528b, #21918c, #5ec962, #fde725); }
"""

INTRO = """# sr-blockwise: 8x8 → 32x32 faces, decoded live
An Image Transformer writes the 32x32 face one intensity at a time (3,072 of them). Blockwise
parallel decoding (Stern et al. 2018) lets extra heads propose **k** intensities at once and keeps
the longest run the model agrees with: **exact** mode gives the greedy image in fewer model
calls; **approximate** mode also accepts proposals within **eps** levels, for bigger blocks;
**sample** draws a random face by speculative sampling: the heads' sampled proposals are kept
or redrawn so that the face is a true sample of the model, in fewer calls.

The model learned faces framed as CelebA's aligned photos: each face of your photo is found
(with its eyes, nose and mouth) and aligned to that framing. Pick a face below the photo, or
draw a box around one too small to be found: click two corners on the photo."""

PASTED_LABEL = "Pasted back: the exact result in your photo, at the scale the model works at"
PASTED_BICUBIC_LABEL = "Beside it: the bicubic upscale of the same 8x8 pasted in the same way"

MAP_HELP = """Block maps colour each pixel by the length of the blocks its intensities were accepted in:
1 per call (as greedy) <span class="legend"></span> k per call; grey: not decoded yet."""


def build_app(model, weights_name: str, examples: list | None = None, celeba: list | None = None,
              progress_every: int = 8, time_limit: float | None = 300.0, example_dir: str | None = None,
              service=None, serial: bool = False):
    """The Gradio Blocks for a loaded model. examples / celeba: lists of sr_blockwise.examples.Example.
    service: the serve.DecodeService the page and the HTTP API decode through (default: one made
    here, closed with the page). serial: the API serves one request at a time, whole (the
    benchmark's 'before')."""
    service = service or DecodeService(model, progress_every=progress_every)
    examples, celeba = examples or [], celeba or []
    example_dir = example_dir or tempfile.mkdtemp(prefix="sr-blockwise-demo-")
    ex_paths = write_examples(examples, Path(example_dir) / "builtin")
    cb_paths = write_examples(celeba, Path(example_dir) / "celeba")
    # delete_cache: streamed frames are files in gradio's cache; drop those older than an hour
    with gr.Blocks(title="sr-blockwise demo", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        page = layout(model, weights_name, list(zip(ex_paths, examples)), list(zip(cb_paths, celeba)))
        wire(page, Upscale(page, service, weights_name, time_limit), ex_paths, cb_paths)
    demo.example_dir = example_dir
    demo.service = service
    demo.api = make_api(Upscaling(model, service, weights_name), UPLOAD_MB, serial=serial)
    return demo


def launch(demo, host="127.0.0.1", port=7860, share=False, max_queue=64, prevent_thread_lock=False,
           quiet=False):
    """Start the server, the page and the HTTP API (webapi.API_PATH) on it; queue limits keep
    several users fairly served (FIFO, bounded)."""
    from sr_blockwise.serving.webapi import API_PATH
    demo.queue(max_size=max_queue, default_concurrency_limit=1)
    out = demo.launch(server_name=host, server_port=port, share=share, css=CSS,
                      prevent_thread_lock=True, quiet=quiet, show_error=False,
                      max_file_size=f"{UPLOAD_MB}mb", allowed_paths=[demo.example_dir], ssr_mode=False,
                      mcp_server=False, pwa=False, footer_links=["api", "settings"])
    demo.app.mount(API_PATH, demo.api)  # Gradio's app is made in launch; requests are routed per call
    if not quiet:
        print(f"HTTP API: http://{host}:{port}{API_PATH}/upscale (docs: {API_PATH}/docs)")
    if not prevent_thread_lock:
        demo.block_thread()
    return out


# ---------------------------------------------------------------- the page's components

@dataclass
class Page:
    """The components the handlers read and write, in the order the page shows them."""
    photo: gr.File
    ex_gallery: gr.Gallery
    cb_gallery: gr.Gallery
    lr_img: gr.Image
    note: gr.Markdown
    choice: gr.Textbox
    view: gr.Image
    faces: gr.Gallery
    corner: gr.State  # the first corner of a box being drawn, in the photo's pixels
    k: gr.Slider
    eps: gr.Slider
    with_greedy: gr.Checkbox
    with_sample: gr.Checkbox
    match: gr.Checkbox
    guidance: gr.Slider
    guard: gr.Slider
    temperature: gr.Slider
    seed: gr.Number
    go: gr.Button
    status: gr.Markdown
    bicubic_img: gr.Image
    mode_columns: dict  # mode -> its gr.Column
    mode_outputs: dict  # mode -> (its image, its block map, its numbers)
    real_img: gr.Image
    pasted: gr.Image
    pasted_bicubic: gr.Image
    stats_json: gr.JSON

    def upscale_inputs(self) -> list:
        return [self.photo, self.choice, self.k, self.eps, self.with_greedy, self.match, self.guidance,
                self.with_sample, self.temperature, self.seed, self.guard]

    def mode_components(self) -> list:
        return [c for mode in self.mode_outputs for c in self.mode_outputs[mode]]

    def upscale_outputs(self) -> list:
        return [self.lr_img, self.real_img, self.note, self.bicubic_img, self.status, *self.mode_components(),
                self.stats_json, self.pasted, self.pasted_bicubic]

    def preview_outputs(self) -> list:
        return [self.lr_img, self.real_img, self.note, self.view, self.faces, self.corner]

    def results(self) -> list:
        """What belongs to the input decoded last: a new input, or a refused one, clears it, its
        face's 8x8, real crop and note too."""
        return [self.bicubic_img, self.status, *self.mode_components(), self.stats_json, self.pasted,
                self.pasted_bicubic, self.lr_img, self.real_img, self.note]


def layout(model, weights_name: str, examples: list, celeba: list) -> Page:
    """The page's components, made inside the gr.Blocks being built. examples / celeba: (path,
    sr_blockwise.examples.Example) pairs for the two example galleries."""
    gr.Markdown(INTRO)
    with gr.Row():
        inputs = input_components(examples, celeba)
    with gr.Row():
        view = gr.Image(label="Faces found (click two corners to box a face too small to be found)",
                        interactive=False, elem_id="view", height=320, buttons=[])
        faces = gr.Gallery(label="Faces found, aligned (click one; the largest is used by default)",
                           columns=6, height=320, allow_preview=False, format="png", elem_id="faces",
                           object_fit="contain",
                           elem_classes="examples", buttons=[])
        corner = gr.State(None)
    with gr.Row():
        settings = setting_components(model)
    results = result_components()
    gr.Markdown(weights_note(model, weights_name))
    return Page(**inputs, view=view, faces=faces, corner=corner, **settings, **results)


def input_components(examples: list, celeba: list) -> dict:
    """The upload, the example galleries, and the chosen face's 8x8 and choice."""
    with gr.Column(scale=3):
        photo = gr.File(label=f"Photo (JPEG, PNG, WebP, BMP; up to {UPLOAD_MB} MB) or an 8x8 image",
                        file_count="single", type="filepath", elem_id="photo", height=110)
        ex_gallery = gr.Gallery([(path, e.caption) for path, e in examples],
                                label="Built-in examples (click one)", columns=7, height=125,
                                allow_preview=False, format="png", elem_classes="examples",
                                buttons=[], visible=bool(examples))
        cb_gallery = gr.Gallery([(path, e.caption) for path, e in celeba],
                                label="Held-out CelebA faces (click one; the real 32x32 is shown "
                                      "beside the output)", columns=8, height=125, allow_preview=False,
                                format="png", elem_classes="examples", buttons=[],
                                visible=bool(celeba))
    with gr.Column(scale=2):
        lr_img = small_image("8x8: what the model sees", "lr", height=190)
        note = gr.Markdown(elem_id="note")
        choice = gr.Textbox("", label="Face", elem_id="choice", max_lines=1,
                            placeholder="empty: the largest face found",
                            info="a number (1 = the largest face found), 'centre square', or a box "
                                 "'left, top, right, bottom' in the photo's pixels; set by a click on "
                                 "a face below, or on two corners of the photo")
    return dict(photo=photo, ex_gallery=ex_gallery, cb_gallery=cb_gallery, lr_img=lr_img, note=note,
                choice=choice)


def setting_components(model) -> dict:
    """The decoding settings, starting at the page's defaults for this model."""
    heads = model.cfg.n_blockwise
    k0, eps0, w0 = page_defaults(model)
    k = gr.Slider(1, heads, value=k0, step=1, label="k: block size",
                  info=f"intensities proposed per model call (1 = greedy; this model has {heads} heads)")
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
    guard = gr.Slider(0, 64, value=DEFAULT_GUARD, step=1, label="cell guard (levels)", elem_id="guard",
                      info="exact, approximate and greedy: keep each 4x4 cell from drifting further "
                           "than this off its input pixel while it is decoded, as collapses into a "
                           "flat wrong colour do (0: off, the model as trained; samples: always off)")
    temperature = gr.Slider(0.1, 1.5, value=0.8, step=0.05, label="temperature (sample)",
                            elem_id="temperature",
                            info="1: the model's own distribution; lower: safer, smoother faces")
    # no minimum=: Gradio refuses a value below it with a traceback in the server's log; the
    # decoder's own check refuses it with one line on the page
    seed = gr.Number(0, precision=0, label="seed (sample)", elem_id="seed",
                     info="the same seed and settings give the same face")
    return dict(k=k, eps=eps, with_greedy=with_greedy, with_sample=with_sample, match=match,
                guidance=guidance, guard=guard, temperature=temperature, seed=seed)


def result_components() -> dict:
    """The Upscale button, its status line, and the results: a column per mode beside the
    bicubic upscale and the real face, the result pasted back, and all numbers."""
    go = gr.Button("Upscale", variant="primary", elem_id="go")
    status = gr.Markdown(elem_id="status")
    with gr.Row(equal_height=False):
        bicubic_img = small_image("Bicubic", "bicubic")
        mode_columns, mode_outputs = {}, {}
        for mode in COLUMN_MODES:
            with gr.Column(min_width=160, visible=mode in ("exact", "approx")) as column:
                img = small_image(TITLES[mode], f"out-{mode}")
                bmap = small_image(f"{TITLES[mode]}: block map", f"map-{mode}", height=120)
                md = gr.Markdown(elem_id=f"stats-{mode}")
            mode_columns[mode], mode_outputs[mode] = column, (img, bmap, md)
        real_img = small_image("Real 32x32 (the aligned crop)", "real")
    # pasted back at the model's scale (a few dozen pixels for a large face): served at that
    # size, shown enlarged with pixelated rendering by the CSS, as the 32x32 images
    with gr.Row():
        pasted = gr.Image(label=PASTED_LABEL, format="png", interactive=False, elem_id="pasted",
                          height=400, elem_classes="pixelated", buttons=["download"])
        pasted_bicubic = gr.Image(label=PASTED_BICUBIC_LABEL, format="png", interactive=False,
                                  elem_id="pasted-bicubic", height=400, elem_classes="pixelated",
                                  buttons=["download"])
    gr.Markdown(MAP_HELP)
    with gr.Accordion("All numbers (JSON)", open=False):
        stats_json = gr.JSON(elem_id="stats-json")
    return dict(go=go, status=status, bicubic_img=bicubic_img, mode_columns=mode_columns,
                mode_outputs=mode_outputs, real_img=real_img, pasted=pasted, pasted_bicubic=pasted_bicubic,
                stats_json=stats_json)


def small_image(label, elem_id, height=200):
    # 32x32 PNGs (downloads stay 32x32), shown enlarged with pixelated rendering by the CSS
    return gr.Image(label=label, format="png", height=height, interactive=False, elem_id=elem_id,
                    elem_classes="pixelated", buttons=["download"])


def weights_note(model, weights_name: str) -> str:
    """The footer: the weights, their size and the dtype most of them are in (a few tables stay
    float64)."""
    sizes = Counter()
    for t in model.parameters():
        sizes[str(t.dtype).removeprefix("torch.")] += t.numel()
    return (f"Weights: `{weights_name}` ({sum(sizes.values()) / 1e6:.1f}M parameters, "
            f"{sizes.most_common(1)[0][0]}). Everything runs on this server; nothing is sent anywhere else.")


# ---------------------------------------------------------------- the handlers

def user_input(path, choice) -> Prepared:
    """The chosen face's input (live.prepare_input); a missing or unusable one: one line on the page."""
    if not path:
        raise gr.Error("Upload a photo or pick an example first.", title="No input", print_exception=False)
    try:
        return prepare_input(path, choice)
    except BadImage as e:
        raise gr.Error(str(e), title="Not a usable image", print_exception=False) from None
    except DetectorMissing as e:
        raise gr.Error(str(e), title="Face detection is not installed", print_exception=False) from None


def preview(path, choice):
    """The photo with its faces' boxes, the faces found (a gallery), and the chosen face's input."""
    if not path:
        return None, None, "", None, gr.Gallery(value=None), None
    p = user_input(path, choice)
    faces = [(f.crop, f"{i + 1}: {f.size * p.photo.size[0] / p.photo.image.width:.0f} px")
             for i, f in enumerate(p.photo.faces)]
    view = photo_view(p.photo, p.chosen) if p.chosen is not None else None  # not for 8x8 / 32x32
    return p.lr, p.face, p.note, view, gr.Gallery(value=faces or None), None


def pick_face(evt: gr.SelectData):  # gradio passes the click by this annotation
    return str(evt.index + 1)


def click_corner(path, first, evt: gr.SelectData):
    """A click on the photo: the first corner of a box, or the second, which sets the box."""
    if not path:
        return gr.update(), None, gr.update()
    photo_faces = read_photo(path)
    x, y = view_to_photo(photo_faces, *evt.index)
    if first is None:
        return gr.update(), (x, y), photo_view(photo_faces, None, (x, y))
    (x0, y0) = first
    box = (min(x0, x), min(y0, y), max(x0, x), max(y0, y))
    return ", ".join(f"{v:.0f}" for v in box), None, gr.update()


def picker(paths):
    """An example gallery's click handler: the clicked example's file, as if uploaded."""
    def pick(evt: gr.SelectData):  # gradio passes the click by this annotation
        return paths[evt.index]
    return pick


def cleared(components) -> list:
    """Each component emptied; the pasted panels' labels, which name the last face's scale, back
    to their first ones."""
    labels = {"pasted": PASTED_LABEL, "pasted-bicubic": PASTED_BICUBIC_LABEL}
    return [("" if isinstance(c, gr.Markdown) else gr.update(value=None, label=labels[c.elem_id])
             if c.elem_id in labels else None) for c in components]


def checked_options(modes, k, eps, prior_weight, temperature, seed, guard) -> dict:
    """Each mode's decoding.DecodeOptions for the page's settings; a bad setting: one line on the page."""
    try:
        return options_per_mode(modes, k=k, eps=eps, temperature=temperature, seed=seed, prior_weight=prior_weight,
                                guard=guard)
    except ValueError as e:
        raise gr.Error(str(e), title="Bad setting", print_exception=False) from None


class Upscale:
    """The Upscale button: the chosen face decoded in each mode through the decode service, each
    mode's frames streamed to its column, then the numbers and the result pasted back."""

    def __init__(self, page: Page, service, weights_name: str, time_limit: float | None):
        self.page, self.service, self.weights_name, self.time_limit = page, service, weights_name, time_limit

    # no docstring: Gradio shows a handler's docstring as its API endpoint's description
    def upscale(self, path, face_choice, k_val, eps_val, greedy_too, match_8x8, prior_w, sample_too, temp,
                seed_val, guard_val):
        p = user_input(path, face_choice)
        prior_w, guard_val = float(prior_w), float(guard_val)
        modes = ["exact", "approx"] + (["greedy"] if greedy_too else []) + (["sample"] if sample_too else [])
        options = checked_options(modes, int(k_val), int(eps_val), prior_w, float(temp), int(seed_val or 0),
                                  guard_val)
        stats = {"weights": self.weights_name, "input": p.info, "match_input": bool(match_8x8),
                 "prior_weight": prior_w, "guard": guard_val}
        images = {}  # as shown (matched or not): the stats compare what the page shows
        view = self.first_view(p, modes)
        yield dict(view)
        # the modes decode one after another, not at once: on a CPU their timings stay honest
        for mode in modes:
            yield from self.decode(mode, options[mode], p.lr, match_8x8, view, stats, images)
        yield self.final_view(p, options, view, stats, images)

    def first_view(self, p: Prepared, modes) -> dict:
        """The page as the decodes start: the input's panels, each mode to run waiting, the rest empty."""
        page = self.page
        blank = np.full((32, 32, 3), FILL, np.uint8)
        view = {page.lr_img: p.lr, page.real_img: p.face, page.note: p.note, page.bicubic_img: bicubic_upscale(p.lr),
                page.status: "", page.stats_json: None, page.pasted: None, page.pasted_bicubic: None}
        for mode, (img, bmap, md) in page.mode_outputs.items():
            view.update({img: blank if mode in modes else None, bmap: None,
                         md: "waiting..." if mode in modes else ""})
        return view

    def decode(self, mode, opts, lr, match_8x8, view, stats, images):
        """One mode's decode: its frames as they come, then its result, which goes into view,
        stats and images too."""
        img, bmap, md = self.page.mode_outputs[mode]
        try:
            for item in self.service.stream(lr, opts, time_limit=self.time_limit):
                if isinstance(item, Frame):
                    yield {img: partial_image(item.tokens, item.done),
                           bmap: block_map_image(item.block_map, item.done, opts.k),
                           md: running_markdown(mode, opts, item)}
                    continue
                stats[mode] = result_stats(mode, opts, item)
                images[mode] = match_input(item.images[0], lr) if match_8x8 else item.images[0]
                view.update({img: images[mode],
                             bmap: block_map_image(item.block_map[0], GREEDY_CALLS, opts.k),
                             md: final_markdown(mode, opts, stats[mode])})
                yield {img: view[img], bmap: view[bmap], md: view[md]}
        except (TimeoutError, Busy) as e:
            raise gr.Error(str(e), title="Server busy", print_exception=False) from None
        except Exception as e:  # a bug: the traceback goes to the server log, one line to the page
            traceback.print_exc()
            raise gr.Error(f"decoding failed: {type(e).__name__}: {e}", title="Decoding failed",
                           print_exception=False) from None

    def final_view(self, p: Prepared, options, view, stats, images) -> dict:
        """The page when every mode is done: the modes compared, the exact result pasted back,
        and all numbers."""
        page = self.page
        compare(stats, images)
        for mode, opts in options.items():
            view[page.mode_outputs[mode][2]] = final_markdown(mode, opts, stats[mode])
        view[page.status] = "Done: " + ", ".join(f"{m} {stats[m]['seconds']:.2f} s" for m in options) + "."
        shown = pasted_view(p, images["exact"])
        if shown is not None:
            stats["pasted_back"] = {**shown.info, "label": shown.label}
            view[page.pasted] = gr.update(value=shown.model, label=f"{shown.label}: the exact result pasted in")
            view[page.pasted_bicubic] = gr.update(value=shown.bicubic, label=f"{shown.label}: bicubic pasted in")
        view[page.stats_json] = stats
        return view


# ---------------------------------------------------------------- the events

def wire(page: Page, upscale: Upscale, ex_paths: list, cb_paths: list) -> None:
    """The page's events, inside the gr.Blocks being built. ex_paths / cb_paths: the example
    galleries' files, in their order."""
    # progress, queue position and errors show on one small status line, not on every image
    photo, choice, preview_outputs, results = page.photo, page.choice, page.preview_outputs(), page.results()

    def clear_results():
        return cleared(results)
    # cleared first: a refused input stops the chain, and what belonged to the input before is gone
    photo.change(lambda path: "", photo, choice, api_visibility="private", queue=False).then(
        clear_results, None, results, api_visibility="private", queue=False).then(
        preview, [photo, choice], preview_outputs, api_name="preview", concurrency_limit=4,
        show_progress="minimal", show_progress_on=[page.note])
    choice.submit(clear_results, None, results, api_visibility="private", queue=False).then(
        preview, [photo, choice], preview_outputs, api_visibility="private",
        concurrency_limit=4, show_progress="minimal", show_progress_on=[page.note])
    page.faces.select(pick_face, None, choice, api_visibility="private", queue=False).then(
        clear_results, None, results, api_visibility="private", queue=False).then(
        preview, [photo, choice], preview_outputs, api_visibility="private")
    # the second corner of a box sets the face: only then are the results cleared and the face shown
    page.view.select(click_corner, [photo, page.corner], [choice, page.corner, page.view],
                     api_visibility="private").then(
        lambda first: clear_results() if first is None else [gr.update()] * len(results),
        page.corner, results, api_visibility="private", queue=False).then(
        lambda path, c, first: preview(path, c) if first is None else (gr.update(),) * 6,
        [photo, choice, page.corner], preview_outputs, api_visibility="private")
    page.ex_gallery.select(picker(ex_paths), None, photo, api_visibility="private", queue=False)
    page.cb_gallery.select(picker(cb_paths), None, photo, api_visibility="private", queue=False)
    for box, mode in ((page.with_greedy, "greedy"), (page.with_sample, "sample")):  # the optional columns
        box.change(lambda v: gr.Column(visible=v), box, page.mode_columns[mode], api_visibility="private",
                   queue=False)
    # many requests at once: their faces decode together in the service's batches, and each
    # request's photo is read while others decode (the queue is bounded in launch)
    page.go.click(upscale.upscale, page.upscale_inputs(), page.upscale_outputs(), api_name="upscale",
                  concurrency_limit=PAGE_REQUESTS, concurrency_id="decode", show_progress="full",
                  show_progress_on=[page.status])
