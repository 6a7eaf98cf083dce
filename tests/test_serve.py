"""The decode service (sr_blockwise/serving/service.py) and the HTTP API beside the demo's page
(sr_blockwise/serving/webapi.py): real servers on 127.0.0.1, the random tiny model from conftest."""
import base64
import http.client
import io
import json
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import two_faces
from sr_blockwise.checkpoints import load_model
from sr_blockwise.decoding import DecodeOptions, decode, options_for
from sr_blockwise.serving.service import Busy, DecodeService
from sr_blockwise.serving.webapi import API_PATH, Upscaling, make_api


@pytest.fixture(scope="module")
def model(tiny_weights):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model(tiny_weights)
    torch.set_num_threads(threads)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, data: bytes, filename: str = "photo.png", timeout: float = 120, **fields):
    """A multipart POST, as curl -F sends it: (status, headers, JSON body)."""
    b = uuid.uuid4().hex
    parts = [f'--{b}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()]
    parts.append(f'--{b}\r\nContent-Disposition: form-data; name="image"; filename="{filename}"\r\n'
                 f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    body = b"".join(parts) + f"--{b}--\r\n".encode()
    req = urllib.request.Request(url, body, {"Content-Type": f"multipart/form-data; boundary={b}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read() or b"{}")


def png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def serve_api(app):
    """A FastAPI app on a real uvicorn server in a thread: (url, stop)."""
    import uvicorn
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)

    def stop():
        server.should_exit = True
        th.join(10)
    return f"http://127.0.0.1:{port}", stop


# ---------------------------------------------------------------- the service

@pytest.mark.parametrize("workers", [1, 2])
def test_concurrent_faces_equal_each_decoded_alone(model, rng, workers):
    """Faces of several modes submitted at once from many threads, batched together where their
    options match, with one worker or rounds side by side (trees decode on the PyTorch engine,
    whose cache is the model's: its rounds one at a time): each output is the one decode() gives
    that face alone."""
    lrs = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    modes = [options_for("exact", 4, 0), options_for("approx", 4, 8),
             options_for("sample", 4, 0, temperature=0.9, seed=5)]
    if workers > 1:
        modes += [DecodeOptions.parse("exact-heads:k=4:tree=4"), DecodeOptions.parse("eps=2:k=4:tree=6")]
    jobs = [(lr, o) for lr in lrs for o in modes]
    service = DecodeService(model, max_batch=8, workers=workers)
    got = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def client(i):
        start.wait()
        got[i] = service.decode(*jobs[i], timeout=120)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = service.info()
    service.close()
    assert info["served"] == len(jobs) and info["rounds"] < len(jobs)  # some faces shared a decode
    assert max(r.extra["batch"] for r in got) > 1
    for (lr, o), r in zip(jobs, got):
        alone = decode(model, lr[None], o)
        assert (r.images == alone.images).all() and r.stats[0].calls == alone.stats[0].calls


def test_a_face_that_arrives_while_its_options_decode_joins_the_running_batch(model, rng):
    """Continuous batching: a face submitted while a face of the same options decodes joins that
    batch between calls (no round of its own, no waiting for the first to finish), and both
    outputs are those of each face decoded alone."""
    service = DecodeService(model, max_batch=4, progress_every=1)
    opts = options_for("approx", 4, 2)
    lrs = rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    later = []

    def first_frame(frame):  # called by the worker between calls of the running batch
        if not later:
            later.append(service.submit(lrs[1], opts))
    first = service.submit(lrs[0], opts, first_frame)
    a = first.wait(120)
    b = later[0].wait(120)
    info = service.info()
    service.close()
    assert info["rounds"] == 1 and b.extra["batch"] == 2
    for lr, r in zip(lrs, (a, b)):
        alone = decode(model, lr[None], opts)
        assert (r.images == alone.images).all() and r.stats[0].calls == alone.stats[0].calls


def test_full_queue_refuses_with_retry_after_and_cancelled_faces_leave(model, rng):
    lr = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    service = DecodeService(model, max_waiting=0)
    with pytest.raises(Busy) as e:
        service.submit(lr, options_for("exact", 4, 0))
    assert e.value.retry_after >= 1 and "try again" in str(e.value)
    service.close()
    service = DecodeService(model, max_waiting=4)
    with service._cond:  # the worker held: faces wait, one leaves
        tickets = [service.submit(lr, options_for("exact", 4, 0)) for _ in range(4)]
        with pytest.raises(Busy):
            service.submit(lr, options_for("exact", 4, 0))
        tickets[1].cancel()
    t = service.submit(lr, options_for("exact", 4, 0))  # its place is free
    assert t.wait(60).images.shape == (1, 32, 32, 3) and tickets[0].wait(60) is not None
    service.close()


def test_stream_yields_frames_then_the_result(model, rng):
    lr = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    service = DecodeService(model, progress_every=4)
    items = list(service.stream(lr, options_for("exact", 2, 0), min_interval=0))
    service.close()
    assert items[-1].images.shape == (1, 32, 32, 3)
    assert all(f.done <= 3072 for f in items[:-1])


# ---------------------------------------------------------------- the HTTP API

@pytest.fixture(scope="module")
def demo_server(model, tmp_path_factory):
    """The demo's real server: the page and the API on one port."""
    from apps.demo import build_app, launch
    demo = build_app(model, "tiny-random", [], [], progress_every=16,
                     example_dir=str(tmp_path_factory.mktemp("examples")))
    port = free_port()
    launch(demo, port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}{API_PATH}"
    demo.close()
    demo.service.close()


def test_api_upscales_every_face_and_concurrent_requests_get_their_own(demo_server, model):
    photo = png(two_faces())
    small = png(Image.fromarray(np.random.default_rng(1).integers(0, 256, (8, 8, 3), dtype=np.uint8)))
    status, _, alone = post(f"{demo_server}/upscale", photo, face="all", modes="exact,approx", k=4, eps=8,
                            paste_back="true")
    assert status == 200, alone
    assert len(alone["faces"]) == 2 and alone["input"]["faces_found"] == 2
    out = alone["faces"][0]["outputs"]
    assert set(out) == {"exact", "approx"} and out["exact"]["stats"]["k"] == 4
    assert Image.open(io.BytesIO(base64.b64decode(out["exact"]["png"]))).size == (32, 32)
    assert Image.open(io.BytesIO(base64.b64decode(alone["pasted_back"]["png"]))).size[0] > 0
    status, _, small_alone = post(f"{demo_server}/upscale", small, modes="exact,sample", k=4, seed=3)
    assert status == 200 and small_alone["faces"][0]["face"] is None

    def pngs(body):
        return [[f["outputs"][m]["png"] for m in sorted(f["outputs"])] for f in body["faces"]]
    results = [None] * 12
    start = threading.Barrier(len(results))

    def client(i):
        start.wait()
        if i % 2:
            results[i] = post(f"{demo_server}/upscale", photo, face="all", modes="exact,approx", k=4, eps=8)
        else:
            results[i] = post(f"{demo_server}/upscale", small, modes="exact,sample", k=4, seed=3)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (status, _, body) in enumerate(results):
        assert status == 200, body
        assert pngs(body) == pngs(alone if i % 2 else small_alone)
    assert max(f["outputs"]["exact"]["stats"]["batch"] for _, _, b in results for f in b["faces"]) > 1
    with urllib.request.urlopen(f"{demo_server}/openapi.json", timeout=30) as r:
        assert "/upscale" in json.loads(r.read())["paths"]
    with urllib.request.urlopen(f"{demo_server}/health", timeout=30) as r:
        assert json.loads(r.read())["waiting"] == 0


def test_page_requests_at_once_each_get_their_own(demo_server, model, tmp_path):
    """The page's /upscale called by several clients at once: they decode side by side through
    the service, and each shows the faces the library decodes for its input alone."""
    from gradio_client import Client, handle_file
    from sr_blockwise.data import image_to_input, open_rgb
    paths = []
    for i in range(4):
        path = tmp_path / f"face{i}.png"
        Image.fromarray(np.random.default_rng(10 + i).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    client = Client(demo_server.removesuffix(API_PATH), verbose=False, analytics_enabled=False, download_files=False)
    k = [2, 4, 4, 6]
    jobs = [client.submit(handle_file(p), "", k[i], 8, False, False, 1.0, False, 0.8, 0, 0, api_name="/upscale")
            for i, p in enumerate(paths)]
    for i, (p, job) in enumerate(zip(paths, jobs)):
        out = job.result(timeout=120)
        lr, _ = image_to_input(open_rgb(p))
        for mode, file in [("exact", out[5]), ("approx", out[8])]:
            got = np.asarray(Image.open(urllib.request.urlopen(file["url"], timeout=30)).convert("RGB"))
            assert (got == decode(model, lr[None], options_for(mode, k[i], 8, prior_weight=1.0)).images[0]).all()


def test_api_errors(demo_server, tmp_path):
    status, _, body = post(f"{demo_server}/upscale", b"not an image at all\n", "notes.txt")
    assert status == 415 and "not a readable image" in body["error"]
    for name in ("..", "a\x00b.png", "x" * 300 + ".png"):  # saved under a name of its own, said as such
        status, _, body = post(f"{demo_server}/upscale", b"not an image", name)
        assert status == 415 and body["error"].startswith(("upload", "ab.png", "xxx"))
    blank = png(Image.new("RGB", (300, 200), (128, 128, 128)))
    status, _, body = post(f"{demo_server}/upscale", blank, "blank.png")
    assert status == 422 and "no face found" in body["error"]
    status, _, body = post(f"{demo_server}/upscale", blank, "blank.png", face="centre square", modes="exact", k=2)
    assert status == 200 and len(body["faces"]) == 1
    status, _, body = post(f"{demo_server}/upscale", blank, "blank.png", modes="fast")
    assert status == 422 and "modes" in body["error"]
    status, _, body = post(f"{demo_server}/upscale", blank, "blank.png", face="centre square", k=99)
    assert status == 422


def test_api_too_large_and_queue_full(model):
    service = DecodeService(model, max_waiting=0)
    url, stop = serve_api(make_api(Upscaling(model, service), upload_mb=1))
    try:
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)
        conn.putrequest("POST", "/upscale")  # the headers alone: refused before the upload is sent
        conn.putheader("Content-Type", "multipart/form-data; boundary=x")
        conn.putheader("Content-Length", str(2 << 20))
        conn.endheaders()
        r = conn.getresponse()
        assert r.status == 413 and "1 MB" in json.loads(r.read())["error"]
        conn.close()
        status, headers, body = post(f"{url}/upscale", png(Image.new("RGB", (8, 8))), "face.png")
        assert status == 503 and int(headers["Retry-After"]) >= 1 and "busy" in body["error"]
    finally:
        stop()
        service.close()


def test_bench_serve_against_a_running_server(demo_server, tmp_path, capsys):
    from sr_blockwise.cli import main
    from sr_blockwise.serving.bench import fresh_bytes
    two_faces().save(tmp_path / "pair.png")
    two_faces().save(tmp_path / "pair.jpg", quality=90)
    for f in ("pair.png", "pair.jpg"):  # new bytes, the same pixels
        data = (tmp_path / f).read_bytes()
        again = fresh_bytes(data, "tag")
        assert again != data
        assert (np.asarray(Image.open(io.BytesIO(again))) == np.asarray(Image.open(io.BytesIO(data)))).all()
    out = tmp_path / "bench.json"
    assert main(["bench-serve", "--url", demo_server.removesuffix(API_PATH), "--clients", "1,3", "--seconds", "1",
                 "--photo", str(tmp_path / "pair.png"), "--eps", "8", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["clients"] for r in rows] == [1, 3]
    assert all(r["served"] >= 1 and r["errors"] == r["wrong"] == 0 and r["peak_rss_mb"] > 0 for r in rows)
    assert "| url | 3 |" in capsys.readouterr().out


def test_a_client_that_leaves_frees_its_place(model, rng):
    """The worker held inside a round: a request's faces wait; its client hangs up; they leave the queue."""
    service = DecodeService(model, max_waiting=8, progress_every=1)
    held, release = threading.Event(), threading.Event()

    def hold(frame):
        held.set()
        release.wait(60)
    first = service.submit(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), options_for("exact", 2, 0), hold)
    assert held.wait(60)
    url, stop = serve_api(make_api(Upscaling(model, service)))
    try:
        b = uuid.uuid4().hex  # a client that sends its request, waits a second and hangs up
        body = (f'--{b}\r\nContent-Disposition: form-data; name="image"; filename="face.png"\r\n\r\n'.encode()
                + png(Image.new("RGB", (8, 8))) + f"\r\n--{b}--\r\n".encode())
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=1)
        conn.request("POST", "/upscale", body, {"Content-Type": f"multipart/form-data; boundary={b}"})
        with pytest.raises(OSError):
            conn.getresponse()
        conn.close()
        for _ in range(100):
            if service.info()["waiting"] == 0:
                break
            time.sleep(0.05)
        assert service.info()["waiting"] == 0
        release.set()
        assert first.wait(60).images.shape == (1, 32, 32, 3)
    finally:
        release.set()
        stop()
        service.close()


def test_limit_malloc_arenas():
    import platform
    from sr_blockwise.serving.service import limit_malloc_arenas
    assert limit_malloc_arenas(8) or platform.libc_ver()[0] != "glibc"
