"""`sr-blockwise bench-serve`: many clients at once against the HTTP API (webapi) of a real
server, started here on localhost (`sr-blockwise demo`) or given by URL. Each level runs N
clients for a bounded time, each posting the photo again as soon as its last answer came (after a
503, when Retry-After says), and counts served, refused (503), errors and wrong outputs (any face
unlike the one the same request gets alone, before the load), with latency percentiles,
requests/s, decodes/s and the server's peak memory (polled from its /health).

By default every request's upload is new bytes (a comment added to the file, the pixels
unchanged), so the server cannot reuse an earlier upload's faces; --same-photo sends the same
bytes every time.
"""
from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

API = "/api/v1"


def example_photo() -> bytes:
    """The default photo: four faces (scikit-image's astronaut, 560 to 320 px) on a 2400x1400
    JPEG, as a group photo."""
    import skimage.data
    from PIL import Image
    astro = Image.fromarray(skimage.data.astronaut())
    photo = Image.new("RGB", (2400, 1400), (120, 120, 120))
    for i, side in enumerate((560, 480, 400, 320)):
        photo.paste(astro.resize((side, side), Image.Resampling.LANCZOS), (40 + i * 590, 100 + 60 * i))
    buf = io.BytesIO()
    photo.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def fresh_bytes(data: bytes, tag: str) -> bytes:
    """The same picture as new bytes: a JPEG comment or a PNG text chunk holding tag."""
    import struct
    import zlib
    if data[:2] == b"\xff\xd8":
        text = tag.encode()
        return data[:2] + b"\xff\xfe" + struct.pack(">H", len(text) + 2) + text + data[2:]
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        body = b"tEXt" + b"bench\0" + tag.encode()
        chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
        return data[:33] + chunk + data[33:]  # after IHDR
    return data


def post(url: str, data: bytes, fields: dict, timeout: float = 300) -> tuple[int, dict, dict]:
    """A multipart POST (as curl -F): (status, headers, JSON body)."""
    b = uuid.uuid4().hex
    parts = [f'--{b}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()]
    parts.append(f'--{b}\r\nContent-Disposition: form-data; name="image"; filename="photo"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    req = urllib.request.Request(url, b"".join(parts) + f"--{b}--\r\n".encode(),
                                 {"Content-Type": f"multipart/form-data; boundary={b}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read() or b"{}")
        except ValueError:
            body = {}
        return e.code, {k.lower(): v for k, v in e.headers.items()}, body


def outputs(body: dict) -> list:
    return [[f["outputs"][m]["png"] for m in sorted(f["outputs"])] for f in body.get("faces", [])]


@dataclass
class Level:
    server: str
    clients: int
    seconds: float = 0.0
    served: int = 0
    refused: int = 0
    refused_without_retry_after: int = 0
    errors: int = 0
    wrong: int = 0
    latencies: list = field(default_factory=list)
    decodes: int = 0
    peak_rss_mb: float = 0.0
    error_examples: list = field(default_factory=list)

    def row(self) -> dict:
        lat = sorted(self.latencies)

        def pct(p):
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None
        return {"server": self.server, "clients": self.clients, "served": self.served, "refused": self.refused,
                "refused_without_retry_after": self.refused_without_retry_after, "errors": self.errors,
                "wrong": self.wrong, "p50_s": pct(0.5), "p95_s": pct(0.95), "max_s": round(lat[-1], 2) if lat else None,
                "requests_per_s": round(self.served / self.seconds, 3),
                "decodes_per_s": round(self.decodes / self.seconds, 3), "peak_rss_mb": self.peak_rss_mb,
                "seconds": round(self.seconds, 1), "error_examples": self.error_examples[:3]}


def run_level(url: str, server: str, clients: int, seconds: float, photo: bytes, fields: dict, expected: list,
              same_photo: bool) -> Level:
    lv = Level(server, clients)
    lock = threading.Lock()
    stop = threading.Event()
    t0 = time.perf_counter()
    deadline = t0 + seconds

    def client(c: int):
        n = 0
        while time.perf_counter() < deadline:
            n += 1
            data = photo if same_photo else fresh_bytes(photo, f"{c}-{n}-{uuid.uuid4().hex}")
            start = time.perf_counter()
            try:
                status, headers, body = post(f"{url}{API}/upscale", data, fields)
            except Exception as e:  # noqa: BLE001 (a refused connection, a timeout: counted)
                status, headers, body = -1, {}, {"error": f"{type(e).__name__}: {e}"}
            took = time.perf_counter() - start
            with lock:
                if status == 200:
                    lv.served += 1
                    lv.latencies.append(took)
                    lv.decodes += sum(len(f["outputs"]) for f in body["faces"])
                    lv.wrong += outputs(body) != expected
                elif status == 503:
                    lv.refused += 1
                    lv.refused_without_retry_after += "retry-after" not in headers
                else:
                    lv.errors += 1
                    lv.error_examples.append(f"{status}: {body.get('error', body)}"[:200])
            if status == 503:
                time.sleep(min(float(headers.get("retry-after", 1)), max(0.0, deadline - time.perf_counter())))

    def poll_memory():
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"{url}{API}/health", timeout=10) as r:
                    lv.peak_rss_mb = max(lv.peak_rss_mb, json.loads(r.read()).get("rss_mb", 0.0))
            except (OSError, ValueError):
                pass
            stop.wait(0.25)
    poller = threading.Thread(target=poll_memory, daemon=True)
    poller.start()
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lv.seconds = time.perf_counter() - t0  # to the last answer: requests started before the deadline count
    stop.set()
    poller.join()
    return lv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(extra: list[str], weights: str | None, log: Path) -> tuple[subprocess.Popen, str]:
    """`sr-blockwise demo` on a free localhost port; returns once its API answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "sr_blockwise", "demo", "--port", str(port), "--no-celeba", *extra]
    if weights:
        cmd += ["--weights", weights]
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}); its log: {log}")
        try:
            with urllib.request.urlopen(f"{url}{API}/health", timeout=5):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise RuntimeError(f"the server did not answer in 300 s; its log: {log}")


def bench_server(url: str, server: str, levels: list[int], seconds: float, photo: bytes, fields: dict,
                 same_photo: bool, reference: list | None) -> tuple[list[Level], list]:
    """Every level against one server, after one request alone (the outputs every request must give)."""
    status, _, body = post(f"{url}{API}/upscale", photo, fields)
    if status != 200:
        raise RuntimeError(f"{server}: the request alone failed: {status} {body.get('error', body)}")
    alone = outputs(body)
    if reference is not None and alone != reference:
        print(f"bench-serve: {server}: the request alone gives other faces than the first server's")
    out = []
    for n in levels:
        lv = run_level(url, server, n, seconds, photo, fields, alone, same_photo)
        print(format_row(lv.row()), flush=True)
        out.append(lv)
    return out, alone


HEADER = ("server", "clients", "served", "refused", "errors", "wrong", "p50 s", "p95 s", "max s", "req/s",
          "decodes/s", "peak MB")


def format_row(r: dict) -> str:
    cells = [r["server"], r["clients"], r["served"], r["refused"], r["errors"], r["wrong"], r["p50_s"], r["p95_s"],
             r["max_s"], r["requests_per_s"], r["decodes_per_s"], r["peak_rss_mb"]]
    return "| " + " | ".join("-" if c is None else str(c) for c in cells) + " |"


def table(rows: list[dict]) -> str:
    return "\n".join(["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER), *map(format_row, rows)])
