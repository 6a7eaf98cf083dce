"""The Gradio demo (apps/demo.py): the real server on 127.0.0.1, driven through gradio_client and
a real headless Chromium. The model is the random tiny one from conftest (no mocks).

To refresh docs/demo-screenshot.png with real weights:
  SR_BLOCKWISE_DEMO_WEIGHTS=weights/cpu-finetuned.json \
  SR_BLOCKWISE_DEMO_SCREENSHOT=docs/demo-screenshot.png .venv/bin/python -m pytest -q -n 0 tests/test_demo.py -k browser
"""
import argparse
import io
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from apps.demo import build_app, launch
from sr_blockwise.api import DEFAULT_DTYPE, torch_dtype
from sr_blockwise.examples import builtin_examples, celeba_examples
from sr_blockwise import faces as F
from sr_blockwise.checkpoints import load_model
from sr_blockwise.cli.demo import register
from sr_blockwise.data import BadImage, image_to_input, match_input, open_rgb
from sr_blockwise.serving.live import (FILL, Frame, block_map_image, compare, decode_live, final_markdown, parse_choice,
                               partial_image, pasted_view, photo_view, prepare_input, read_photo,
                               running_markdown,
                               view_to_photo)
from sr_blockwise.decoding import DEFAULT_GUARD, DEFAULT_PRIOR_WEIGHT, decode, options_for

K, EPS = 6, 8  # what the tests ask for; both decodes of the tiny model take a few seconds each
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model(tiny_weights):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine is shared: one thread decodes the tiny model fastest
    shipped = os.environ.get("SR_BLOCKWISE_DEMO_WEIGHTS")  # the screenshot: as `sr-blockwise demo` loads them
    yield load_model(shipped, dtype=torch_dtype(DEFAULT_DTYPE)) if shipped else load_model(tiny_weights)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    name = Path(os.environ["SR_BLOCKWISE_DEMO_WEIGHTS"]).stem if "SR_BLOCKWISE_DEMO_WEIGHTS" in os.environ else "tiny-random"
    demo = build_app(model, name, builtin_examples(), [], progress_every=16,
                     example_dir=str(tmp_path_factory.mktemp("examples")))
    port = free_port()
    launch(demo, port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A photo to upload and the broken files the issue names."""
    import skimage.data
    d = tmp_path_factory.mktemp("uploads")
    Image.fromarray(skimage.data.astronaut()).save(d / "astronaut.jpg", quality=92)
    pair = Image.new("RGB", (832, 512), (128, 128, 128))  # two faces: the astronaut and a smaller copy
    pair.paste(Image.open(d / "astronaut.jpg"), (0, 0))
    pair.paste(Image.open(d / "astronaut.jpg").resize((320, 320), Image.Resampling.BOX), (512, 96))
    pair.save(d / "pair.png")
    data = (d / "astronaut.jpg").read_bytes()
    (d / "truncated.jpg").write_bytes(data[: len(data) // 3])
    (d / "empty.png").write_bytes(b"")
    (d / "notes.txt").write_text("not an image at all\n")
    Image.new("1", (8000, 6250)).save(d / "big.png")  # 50 megapixels, a small file: read at reduced size
    (d / "huge.png").write_bytes(png_header(20000, 20000))  # 400 MP: over Pillow's decompression-bomb limit
    return {p.stem: str(p) for p in d.iterdir()}


def png_header(w: int, h: int) -> bytes:
    """A PNG that claims w x h pixels and holds none: refused by Pillow on its size alone."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0)) + chunk(b"IEND", b"")


# ---------------------------------------------------------------- without a server

def test_import_is_light():
    # `sr-blockwise --help` imports the demo command's module: it must not pull in torch or gradio
    code = "import sys, sr_blockwise.cli.demo; print('torch' in sys.modules, 'gradio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_register_and_missing_weights(tiny_weights, monkeypatch):
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="command"))
    args = p.parse_args(["demo", "--weights", "/nonexistent/weights.json", "--port", "7999"])
    assert (args.host, args.port, args.share, args.dtype) == ("127.0.0.1", 7999, False, DEFAULT_DTYPE)
    with pytest.raises(ValueError, match="no weights"):  # the CLI prints it as a one-line error
        args.func(args)


def test_pasted_view_is_at_the_models_scale(files, rng):
    """The demo's pasted-back panels: a face larger than the 32x32 output is shown in its
    surroundings at the size where it is the model's 8 px input, 4x (pasted at 32 px at most);
    a face boxed at a few pixels, 4x. Beside it the same with the 8x8's bicubic upscale."""
    out = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    big = prepare_input(files["pair"])  # face 1: the astronaut, a crop of some 250 px
    shown = pasted_view(big, out)
    h, w = shown.model.shape[:2]
    assert shown.bicubic.shape == shown.model.shape and not (shown.bicubic == shown.model).all()
    assert w <= 3 * 32 + 4 and 30 < big.chosen.size * shown.info["scale"] <= 32 + 1e-6
    assert shown.label.startswith(f"Your photo at the size where this face is 8 px ({big.chosen.size:.0f} px -> 8), 4x")
    small = prepare_input(files["pair"], "600, 200, 612, 212")  # a 12 px box: a crop of some 20 px
    assert small.chosen.size <= 32
    shown = pasted_view(small, out)
    assert shown.info["scale"] == 4 and shown.label.startswith(f"Your photo 4x (this face: {small.chosen.size:.0f} px")
    assert shown.info["size"] == [shown.model.shape[1], shown.model.shape[0]] and max(shown.info["size"]) <= 4 * 3 * 32 + 4
    assert pasted_view(prepare_input(files["pair"], "centre square"), out).info["scale"] == 32 / 512


def test_prepare_input(files, tmp_path):
    p = prepare_input(files["astronaut"])
    found = F.find_faces(open_rgb(files["astronaut"]))  # the library's faces, aligned
    assert (p.lr == found[0].lr).all() and (p.face == found[0].crop).all()
    assert "512x512 photo: face 1 of 1 found, aligned" in p.note and p.info["face"]["how"] == "detected"
    c = prepare_input(files["astronaut"], "centre square")
    lr, face = image_to_input(open_rgb(files["astronaut"]))  # no detection: the shared crop + downsample
    assert (c.lr == lr).all() and (c.face == face).all() and "the centre square" in c.note
    Image.fromarray(lr).save(tmp_path / "tiny.png")
    q = prepare_input(tmp_path / "tiny.png")
    assert (q.lr == lr).all() and q.face is None  # an 8x8 image is used as is
    rgba = Image.fromarray(skimage_astronaut()).convert("RGBA")
    rgba.putalpha(200)
    for name, img in [("L.png", Image.open(files["astronaut"]).convert("L")), ("P.png", rgba.convert("P")),
                      ("RGBA.png", rgba), ("RGBA.webp", rgba), ("RGB.bmp", rgba.convert("RGB"))]:
        img.save(tmp_path / name)
        assert prepare_input(tmp_path / name).lr.shape == (8, 8, 3), name
    for bad, why in [("truncated", "not a readable image"), ("empty", "empty file"),
                     ("notes", "not a readable image"), ("huge", "too large")]:
        with pytest.raises(BadImage, match=why) as e:
            prepare_input(files[bad])
        assert os.path.dirname(files[bad]) not in str(e.value)  # no server paths in messages
    big = prepare_input(files["big"])
    assert "8000x6250 photo: the centre square (no face found" in big.note and big.info["size"] == [8000, 6250]


def test_face_choices(files):
    """The page's faces: each found one by number, a drawn box, the centre square; clicks on the
    shown photo map back to its pixels."""
    first, second = prepare_input(files["pair"], "1"), prepare_input(files["pair"], "2")
    assert "face 1 of 2" in first.note and "face 2 of 2" in second.note
    assert first.chosen.size > second.chosen.size and second.chosen.box[0] > 512
    assert (prepare_input(files["pair"], "").lr == first.lr).all()  # the largest by default
    boxed = prepare_input(files["pair"], "600, 200, 612, 212")  # a face a few pixels wide
    assert "the box 600, 200, 612, 212" in boxed.note and boxed.chosen.how == "box"
    for bad, why in [("3", "2 faces found"), ("eyes", "give a face number"), ("1, 2", "give a face number"),
                     ("1e3", "give a face number"), ("2.0", "give a face number"), ("²", "give a face number"),
                     ("1, 2, nan, 4", "give a face number")]:
        with pytest.raises(BadImage, match=why):
            prepare_input(files["pair"], bad)
    assert parse_choice("Centre square") == "centre square" and parse_choice("box: 1,2,3,4") == (1, 2, 3, 4)
    assert parse_choice("612, 212, 600, 200") == (600, 200, 612, 212)  # typed corners in either order, as drawn
    photo = read_photo(files["pair"])
    view = photo_view(photo, first.chosen)
    assert view.shape == (394, 640, 3)  # at most 640 px wide
    assert view_to_photo(photo, 320, 197) == pytest.approx((416, 256), abs=1)


def skimage_astronaut():
    import skimage.data
    return skimage.data.astronaut()


def test_builtin_examples():
    ex = builtin_examples()
    assert len(ex) >= 5 and not any("celeba" in e.name for e in ex)
    assert any(e.image.size == (8, 8) for e in ex)


def test_celeba_examples(celeba_npz, tmp_path):
    ex = celeba_examples(celeba_npz, n=4)
    assert len(ex) == 4 and all(e.image.size == (32, 32) for e in ex)
    ex[0].image.save(tmp_path / ex[0].name)
    p = prepare_input(tmp_path / ex[0].name)
    assert (p.face == np.asarray(ex[0].image)).all()  # the real 32x32 is known and shown
    assert celeba_examples("/nonexistent/celeba32.npz") == []


def test_frame_rendering():
    tokens = np.arange(3072) % 256
    img = partial_image(tokens, 100)
    assert img.shape == (32, 32, 3) and img.reshape(-1)[99] == 99 and img.reshape(-1)[100] == FILL
    bmap = np.full(3072, 6)
    m = block_map_image(bmap, 3, 6)  # one pixel decoded, at the longest block: yellow
    assert tuple(m[0, 0]) == (253, 231, 37) and tuple(m[0, 1]) == (FILL,) * 3


def test_stats_lines_count_calls_against_greedy_only_for_blocks():
    """A blockwise decode's line says how many times fewer calls than greedy; greedy's own (k=1)
    says one call per intensity, not "1.0x fewer"."""
    greedy, exact = options_for("greedy"), options_for("exact", 4)
    s = {"calls": 3072, "speedup_calls": 1.0, "mean_block": 1.0, "seconds": 0.2, "k": 1}
    line = final_markdown("greedy", greedy, s)
    assert "(one per intensity)" in line and "fewer" not in line
    s.update(calls=1536, speedup_calls=2.0, mean_block=2.0, k=4)
    assert "**2.0x fewer**" in final_markdown("exact", exact, s)
    fr = Frame(np.zeros(3072, np.int64), 300, np.ones(3072, np.int64), 300, 0.1)
    assert "fewer" not in running_markdown("greedy", greedy, fr) and "fewer" in running_markdown("exact", exact, fr)


def test_compare_modes():
    a = np.zeros((32, 32, 3), np.uint8)
    b = a.copy()
    b[0, 0, 0] = 5
    stats = {m: {"seconds": s} for m, s in [("exact", 1.0), ("approx", 0.5), ("greedy", 2.0)]}
    compare(stats, {"exact": a, "approx": b, "greedy": a})
    assert stats["approx"]["differs_from_exact"] == 1 and stats["approx"]["max_abs_diff_vs_exact"] == 5
    assert stats["exact"]["identical_to_greedy"] and stats["approx"]["speedup_wall"] == 4.0


def test_demo_command_sets_its_thread_count_before_any_worker_starts(tiny_weights, monkeypatch):
    """`sr-blockwise demo --threads N` (default 1: from a worker thread 2 ran 1.8x slower than 1
    here) is set on the main thread before serving, so every thread started later, the decode
    workers too, begins with N."""
    import threading

    import apps.demo as demo_module
    seen = []

    def fake_launch(demo, *a, **kw):  # what a decode worker started by the server would see
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
    monkeypatch.setattr(demo_module, "launch", fake_launch)
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="command"))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        args = p.parse_args(["demo", "--weights", str(tiny_weights), "--no-celeba"])
        assert args.threads == 1
        args.func(args)
        args = p.parse_args(["demo", "--weights", str(tiny_weights), "--no-celeba", "--threads", "2"])
        args.func(args)
        assert seen == [1, 2]
    finally:
        torch.set_num_threads(before)


def test_decode_live_stops(model):
    import threading
    import time
    lr = image_to_input(Image.fromarray(skimage_astronaut()))[0]
    gen = decode_live(model, lr, options_for("exact", K), progress_every=2, min_interval=0.0)
    assert isinstance(next(gen), Frame)
    gen.close()  # the user left: the worker must stop, not decode on for nobody
    deadline = time.time() + 10
    while any(t.name == "sr-blockwise-decode" for t in threading.enumerate()) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "sr-blockwise-decode" for t in threading.enumerate())
    with pytest.raises(TimeoutError, match="server is busy"):
        list(decode_live(model, lr, options_for("exact", K), progress_every=2, time_limit=0.0))


# ---------------------------------------------------------------- through gradio_client

def test_client_errors_are_messages(server, files):
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError
    client = Client(server, verbose=False, analytics_enabled=False)
    for bad, why in [("truncated", "not a readable image"), ("empty", "empty file"),
                     ("notes", "not a readable image"), ("huge", "too large")]:
        with pytest.raises(AppError, match=why):
            client.predict(handle_file(files[bad]), "", K, EPS, False, api_name="/upscale")
    with pytest.raises(AppError, match="Upload a photo"):
        client.predict(None, "", K, EPS, False, api_name="/upscale")
    with pytest.raises(AppError, match="2 faces found"):
        client.predict(handle_file(files["pair"]), "3", K, EPS, False, api_name="/upscale")
    with pytest.raises(AppError, match="seed=-5: must be a whole number in 0.."):  # the modes' one check, one line
        client.predict(handle_file(files["pair"]), "", K, EPS, False, False, 1.0, True, 0.8, -5, api_name="/upscale")
    lr, face, note, view, gallery = client.predict(handle_file(files["pair"]), "", api_name="/preview")
    assert Image.open(lr).size == (8, 8) and Image.open(face).size == (32, 32)  # the queue still serves
    assert len(gallery) == 2 and "face 1 of 2" in note and Image.open(view).size == (640, 394)


def fetch(file_data: dict) -> np.ndarray:
    """An image output as the client gets it: a PNG over HTTP."""
    import httpx
    r = httpx.get(file_data["url"], timeout=30)
    r.raise_for_status()
    assert r.content[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(io.BytesIO(r.content)))


def test_client_upscale_matches_library(server, files, model):
    from gradio_client import Client, handle_file
    # download_files=False: the client would fetch every streamed frame; fetch the final images only
    client = Client(server, verbose=False, analytics_enabled=False, download_files=False)
    # "match the 8x8 input" off: the decoder's own outputs; input guidance 1 and the cell guard
    # off (the model as trained)
    out = client.predict(handle_file(files["astronaut"]), "centre square", K, EPS, False, False, 1.0,
                         False, 0.8, 0, 0, api_name="/upscale")
    lr_file, real_file, note, bicubic_file, status = out[:5]
    exact_file, approx_file, stats, pasted, pasted_bicubic = out[5], out[8], out[-3], out[-2], out[-1]
    lr, face = image_to_input(open_rgb(files["astronaut"]))
    assert (fetch(lr_file) == lr).all()
    assert (fetch(real_file) == face).all()
    assert fetch(bicubic_file).shape == (32, 32, 3)
    for mode, file in [("exact", exact_file), ("approx", approx_file)]:
        got = fetch(file)
        assert got.shape == (32, 32, 3)
        ref = decode(model, lr[None], options_for(mode, K, EPS, prior_weight=1.0))  # the direct library call
        assert (got == ref.images[0]).all(), mode
        s, r = stats[mode], ref.stats[0]
        assert (s["calls"], s["block_hist"], s["k"]) == (r.calls, r.block_hist, K), mode
        assert s["mean_block"] == pytest.approx(r.mean_block)
        assert s["speedup_calls"] == pytest.approx(3072 / r.calls)
    assert stats["approx"]["eps"] == EPS and "Done" in status
    # the centre square, 512 px: the whole photo at the size where it is 8 px, 4x; beside it bicubic
    assert stats["pasted_back"]["scale"] == 32 / 512 and "where this face is 8 px" in stats["pasted_back"]["label"]
    # (the client gets each with its label: an update)
    assert pasted["label"].startswith("Your photo at the size where this face is 8 px (512 px -> 8), 4x")
    assert "bicubic" in pasted_bicubic["label"]
    assert fetch(pasted["value"]).shape == fetch(pasted_bicubic["value"]).shape == (32, 32, 3)
    assert not (fetch(pasted["value"]) == fetch(pasted_bicubic["value"])).all()
    assert stats["match_input"] is False and stats["prior_weight"] == 1.0 and stats["guard"] == 0
    # the defaults of a 5-argument call: "match the 8x8 input" on, the default input guidance and
    # cell guard; the decodes differ from the model as trained, and each is shown back-projected
    # onto the 8x8 input
    out = client.predict(handle_file(files["astronaut"]), "centre square", K, EPS, False, api_name="/upscale")
    for mode, file in [("exact", out[5]), ("approx", out[8])]:
        ref = decode(model, lr[None], options_for(mode, K, EPS, prior_weight=DEFAULT_PRIOR_WEIGHT,
                                                  guard=DEFAULT_GUARD)).images[0]
        assert (fetch(file) == match_input(ref, lr)).all() and not (ref == match_input(ref, lr)).all(), mode
        assert not (ref == decode(model, lr[None], options_for(mode, K, EPS)).images[0]).all(), mode
        unguarded = decode(model, lr[None], options_for(mode, K, EPS, prior_weight=DEFAULT_PRIOR_WEIGHT)).images[0]
        assert not (ref == unguarded).all(), mode  # the page's guard reached the decoder
    assert out[-3]["match_input"] is True and out[-3]["prior_weight"] == DEFAULT_PRIOR_WEIGHT
    assert out[-3]["guard"] == DEFAULT_GUARD


def test_client_sample_is_the_librarys_speculative_sample(server, files, model):
    """"also sample": the page's sample is the library's (speculative at k > 1) for that seed and
    temperature; another seed draws another face."""
    from gradio_client import Client, handle_file
    client = Client(server, verbose=False, analytics_enabled=False, download_files=False)
    args = [handle_file(files["astronaut"]), "centre square", K, EPS, False, False, 1.0, True, 0.8]
    out = client.predict(*args, 3, api_name="/upscale")
    lr, _ = image_to_input(open_rgb(files["astronaut"]))
    ref = decode(model, lr[None], options_for("sample", K, EPS, temperature=0.8, seed=3, prior_weight=1.0))
    assert (fetch(out[14]) == ref.images[0]).all()
    s = out[-3]["sample"]
    assert (s["k"], s["temperature"], s["seed"], s["block_hist"]) == (K, 0.8, 3, ref.stats[0].block_hist)
    assert s["mean_block"] > 1
    other = client.predict(*args, 4, api_name="/upscale")
    assert not (fetch(other[14]) == ref.images[0]).all()


# ---------------------------------------------------------------- in a real browser

@pytest.mark.skipif(shutil.which("chromium") is None and not os.environ.get("CI"),
                    reason="Debian's chromium is not installed (in CI this fails instead)")
def test_browser(server, files, tmp_path, monkeypatch):
    import time

    from playwright.sync_api import expect, sync_playwright

    import sr_blockwise.decoding as decoding
    decode = decoding.decode

    def slowed(*args, progress=None, **kw):  # the page's decode_live looks decode up per call
        def late(*a):
            time.sleep(0.03)
            progress(*a)
        return decode(*args, progress=late if progress else None, **kw)

    # the native engine decodes the tiny model in well under a second: slowed, so that the page's
    # live state can be seen before the result replaces it
    monkeypatch.setattr(decoding, "decode", slowed)
    shot = os.environ.get("SR_BLOCKWISE_DEMO_SCREENSHOT", str(tmp_path / "demo.png"))
    outside = []  # requests leaving this machine: the page must make none
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # generous waits: under the test workers' load (or CI's) decoding may take minutes;
            # a broken page still fails, only later
            page.set_default_timeout(120_000)
            page.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1", "data:", "blob:"))
                    else outside.append(r.url))
            page.goto(server)
            page.locator("#photo input[type=file]").set_input_files(files["pair"])
            expect(page.locator("#lr img")).to_be_visible(timeout=30_000)  # the 8x8 the model sees
            expect(page.locator("#note")).to_contain_text("face 1 of 2 found", timeout=30_000)  # the largest
            # the input guidance slider starts at the library's default
            expect(page.locator("#guidance input[type=number]")).to_have_value(f"{DEFAULT_PRIOR_WEIGHT:g}")
            expect(page.locator("#guard input[type=number]")).to_have_value(f"{DEFAULT_GUARD:g}")
            expect(page.locator("#faces img")).to_have_count(2, timeout=30_000)  # the gallery of faces found
            # a face's thumbnail is a sixth of the gallery however few faces there are, not half or all of it
            assert page.locator("#faces img").first.bounding_box()["width"] < page.locator("#faces").bounding_box()["width"] / 5
            page.locator("#faces img").nth(1).click()
            expect(page.locator("#choice textarea, #choice input").first).to_have_value("2", timeout=30_000)
            expect(page.locator("#note")).to_contain_text("face 2 of 2 found", timeout=30_000)
            # a box drawn by two clicks on the photo (640 px shown for 832: the photo's px are 1.3x)
            view = page.locator("#view img")
            expect(view).to_be_visible(timeout=30_000)
            # its pixels, not only the element: naturalWidth is 0 until the image has loaded
            page.wait_for_function("() => { const i = document.querySelector('#view img'); "
                                   "return i && i.complete && i.naturalWidth > 0; }", timeout=30_000)
            box = view.bounding_box()
            natural = view.evaluate("i => [i.naturalWidth, i.naturalHeight]")
            k = box["width"] / natural[0]  # shown size / served size (object-fit keeps the ratio)
            k = min(k, box["height"] / natural[1])
            x0 = box["x"] + (box["width"] - natural[0] * k) / 2
            y0 = box["y"] + (box["height"] - natural[1] * k) / 2
            page.mouse.click(x0 + 400 * k, y0 + 150 * k)
            page.wait_for_timeout(1500)  # the first corner is marked before the second click
            page.mouse.click(x0 + 440 * k, y0 + 200 * k)
            expect(page.locator("#note")).to_contain_text("the box", timeout=30_000)
            drawn = page.locator("#choice textarea, #choice input").first.input_value()
            l, t, r, b = (float(v) for v in drawn.split(","))
            assert abs(l - 400 * 1.3) < 8 and abs(b - 200 * 1.3) < 8 and r - l > 40, drawn
            page.locator("#faces img").nth(0).click()  # back to the largest face: the one decoded
            expect(page.locator("#note")).to_contain_text("face 1 of 2 found", timeout=30_000)
            page.locator("#go").click()
            expect(page.locator("#stats-exact")).to_contain_text("decoding", timeout=30_000)  # live
            expect(page.locator("#stats-approx")).to_contain_text("done", timeout=300_000)
            expect(page.locator("#stats-exact")).to_contain_text("model calls", timeout=30_000)
            expect(page.locator("#status")).to_contain_text("Done", timeout=60_000)
            # the result in the photo, at the scale the model works at (face 1 is larger than 32 px):
            # served at that size, shown large; beside it the bicubic face, pasted the same way
            expect(page.locator("#pasted img")).to_be_visible(timeout=30_000)
            expect(page.locator("#pasted")).to_contain_text("where this face is 8 px", timeout=30_000)
            expect(page.locator("#pasted-bicubic")).to_contain_text("bicubic", timeout=30_000)
            served = [page.locator(f"{el} img").evaluate("i => [i.naturalWidth, i.naturalHeight]")
                      for el in ("#pasted", "#pasted-bicubic")]
            assert served[0] == served[1] and max(served[0]) <= 3 * 32 + 4, served  # three crops across
            for el in ("#pasted img", "#pasted-bicubic img"):
                assert page.locator(el).bounding_box()["height"] > 300, el  # shown large enough to see
            for el in ("#out-exact img", "#out-approx img", "#map-exact img", "#bicubic img", "#real img"):
                page.wait_for_function("s => { const i = document.querySelector(s); "
                                       "return i && i.complete && i.naturalWidth > 0; }", arg=el)
                assert page.locator(el).evaluate("i => i.naturalWidth") == 32, el  # served at 32x32
            page.screenshot(path=shot, full_page=True)
            # another face: the results of the one decoded leave the page with it
            page.locator("#faces img").nth(1).click()
            expect(page.locator("#note")).to_contain_text("face 2 of 2 found", timeout=30_000)
            expect(page.locator("#out-exact img")).to_have_count(0, timeout=30_000)
            expect(page.locator("#pasted img")).to_have_count(0, timeout=30_000)
            expect(page.locator("#pasted")).not_to_contain_text("where this face is 8 px", timeout=30_000)
            expect(page.locator("#stats-exact")).not_to_contain_text("model calls", timeout=30_000)
            # a refused face choice clears what belonged to the face before it, as a new one does
            page.locator("#choice textarea, #choice input").first.fill("9")
            page.locator("#choice textarea, #choice input").first.press("Enter")
            expect(page.get_by_text("face 9: 2 faces found").first).to_be_visible(timeout=30_000)
            expect(page.locator("#lr img")).to_have_count(0, timeout=30_000)
            expect(page.locator("#note")).not_to_contain_text("face 2 of 2", timeout=30_000)

            page.reload()  # a fresh page, with the upload box empty again
            page.locator("#photo input[type=file]").set_input_files(files["truncated"])
            expect(page.get_by_text("not a readable image").first).to_be_visible(timeout=30_000)
            assert "Traceback" not in page.content()
        finally:
            browser.close()
    assert outside == []


def test_a_busy_port_is_refused_in_one_line_before_any_work(capsys):
    """`demo` and `rate serve` on a port another server holds: exit 2 and the flag that fixes it
    (Gradio's own error is a traceback that advises launch()'s server_port)."""
    from sr_blockwise.cli import main as cli_main
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        for args in (["demo", "--port", port], ["rate", "serve", "no-such-study", "--port", port]):
            assert cli_main(args) == 2
            err = capsys.readouterr().err
            assert f"cannot listen on 127.0.0.1:{port}" in err and "choose another --port" in err, err
    for args in (["demo", "--port", "70000"], ["rate", "serve", "no-such-study", "--port", "99999"]):
        assert cli_main(args) == 2
        assert "a port is a number in 0..65535" in capsys.readouterr().err


def test_a_port_busy_at_any_address_of_the_host_is_refused(monkeypatch):
    """A host that resolves to several addresses (localhost: 127.0.0.1 and ::1): the port must be
    free at each, as the server may listen on any; an address this machine lacks is no obstacle
    while another binds."""
    from apps import check_port
    real = socket.getaddrinfo

    def resolves_to(*addresses):
        monkeypatch.setattr(socket, "getaddrinfo",
                            lambda host, port, **kw: [i for a in addresses for i in real(a, port, **kw)])
    with socket.socket() as busy:
        busy.bind(("127.0.0.2", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for first, second in (("127.0.0.1", "127.0.0.2"), ("127.0.0.2", "127.0.0.1")):
            resolves_to(first, second)
            with pytest.raises(ValueError, match=f"cannot listen on both:{port} at 127.0.0.2 .*choose another --port"):
                check_port("both", port)
        resolves_to("127.0.0.1", "192.0.2.1")  # TEST-NET-1: no interface of this machine has it
        check_port("both", port)
        resolves_to("192.0.2.1")
        with pytest.raises(ValueError, match=f"cannot listen on away:{port} "):
            check_port("away", port)
