"""The HTTP API for programs, served beside the demo's page on the same server (a FastAPI app,
as Gradio brings, mounted at API_PATH): POST a photo with the options, get each face's 32x32 PNGs
and decode statistics as JSON. Faces decode through a serve.DecodeService, which the page shares.

Errors, as the page's: 413 an upload over the size limit, 415 not a readable image, 422 no face
found or a bad option, 503 with Retry-After when the queue is full. OpenAPI docs at
API_PATH + "/docs".

No `from __future__ import annotations` here: FastAPI reads the endpoints' annotations, whose
types are imported inside make_api.
"""
import base64
import dataclasses
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

API_PATH = "/api/v1"
UPLOAD_MB = 64
API_MODES = ("exact", "approx", "greedy", "sample")
POLL = 0.02  # seconds between looks at a request's faces while they decode


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


@dataclass
class Params:
    """One request's options (the page's names)."""
    modes: str = "exact,approx"  # comma-separated, of API_MODES
    k: int | None = None  # None: the page's k (approx mode's default)
    eps: int = 2
    face: str = ""  # "" (the largest), a number, "all", "centre square" or "left, top, right, bottom"
    paste_back: bool = False
    match_input: bool = True
    guidance: float | None = None  # None: the weights' default input guidance
    guard: float | None = None  # None: the page's (exact, approx, greedy); samples never guarded
    temperature: float = 0.8
    seed: int = 0


def png_base64(img: np.ndarray) -> str:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def upload_name(filename: str | None) -> str:
    """The name an upload is saved under and named by in messages: its own, where it is one."""
    name = "".join(c for c in Path(filename or "").name if c.isprintable())[:100].strip()
    return "upload" if name in ("", ".", "..") else name


def largest_only(choice: str) -> bool:
    """Whether a face choice needs the largest face alone: the search for it stops sooner."""
    return (choice or "").strip().lower() in ("", "largest", "1")


class Upscaling:
    """The API's work, apart from HTTP: a photo's bytes and Params -> the response's JSON."""

    def __init__(self, model, service, weights_name: str = ""):
        self.model, self.service, self.weights_name = model, service, weights_name

    def options(self, p: Params) -> dict:
        from ..decoding import options_per_mode
        from .live import page_defaults
        k0, _, w0 = page_defaults(self.model)
        modes = [m.strip() for m in p.modes.split(",") if m.strip()]
        bad = [m for m in modes if m not in API_MODES]
        if not modes or bad:
            raise ApiError(422, f"modes: a comma-separated list of {', '.join(API_MODES)}; got {p.modes!r}")
        k = k0 if p.k is None else p.k
        w = w0 if p.guidance is None else p.guidance
        try:
            out = options_per_mode(list(dict.fromkeys(modes)), k=k, eps=p.eps, temperature=p.temperature,
                                   seed=p.seed, prior_weight=w, guard=p.guard, model=self.model)
        except ValueError as e:
            raise ApiError(422, str(e)) from None
        return out

    def faces(self, data: bytes, filename: str, choice: str) -> tuple[list, object]:
        """The photo's faces to decode (live.Prepared each) and the photo read."""
        from ..data import BadImage
        from .live import prepare_photo, read_photo
        name = upload_name(filename)
        which = "largest" if largest_only(choice) else "all"
        with tempfile.TemporaryDirectory(prefix="sr-blockwise-api-") as d:  # read_photo bounds detections at once
            path = Path(d) / name
            path.write_bytes(data)
            try:
                photo = read_photo(path, which)
            except BadImage as e:
                raise ApiError(415, str(e)) from None
        c = (choice or "").strip().lower()
        try:
            if c == "all":
                if not photo.faces:
                    raise ApiError(422, f"{name}: no face found; pass face='centre square' or a box")
                return [prepare_photo(photo, str(i + 1)) for i in range(len(photo.faces))], photo
            if largest_only(choice) and not photo.faces and photo.size not in ((8, 8), (32, 32)):
                raise ApiError(422, f"{name}: no face found; pass face='centre square' or a box "
                                    "'left, top, right, bottom'")
            return [prepare_photo(photo, choice)], photo
        except BadImage as e:
            raise ApiError(422, str(e)) from None

    def prepare(self, data: bytes, filename: str, p: Params) -> tuple[dict, list, object]:
        """The options by mode, the faces to decode (live.Prepared each) and the photo read."""
        opts = self.options(p)  # before detection: a bad option costs nothing
        prepared, photo = self.faces(data, filename, p.face)
        if not p.paste_back:  # a request waiting to decode keeps its 8x8s, not its photo: memory stays bounded
            photo = dataclasses.replace(photo, image=None)
            for pr in prepared:
                pr.photo = None
        return opts, prepared, photo

    def submit(self, opts: dict, prepared: list) -> list:
        """Every face in every mode into the decode service: (Prepared, mode, Ticket) each. The
        queue full: none stays queued, and ApiError 503 says when to retry."""
        from .service import Busy
        tickets = []
        try:
            for pr in prepared:
                for mode, o in opts.items():
                    tickets.append((pr, mode, self.service.submit(pr.lr, o)))
        except Busy as e:
            for _, _, t in tickets:
                t.cancel()
            raise ApiError(503, str(e), {"Retry-After": str(e.retry_after)}) from None
        return tickets

    def body(self, p: Params, opts: dict, prepared: list, photo, tickets: list) -> dict:
        """The response, once every ticket is done."""
        from ..data import match_input
        from .live import result_stats
        results, faces = {}, []
        for pr in prepared:
            outputs = {}
            for q, mode, t in tickets:
                if q is not pr:
                    continue
                r = t.wait(0)
                img = match_input(r.images[0], pr.lr) if p.match_input else r.images[0]
                results[(id(pr), mode)] = img
                stats = {**result_stats(mode, opts[mode], r), "batch": r.extra.get("batch", 1),
                         "seconds_queued_and_decoded": round(t.done_at - t.arrived, 4)}
                outputs[mode] = {"png": png_base64(img), "stats": stats}
            face = pr.info.get("face")
            faces.append({"face": face if isinstance(face, dict) else None, "note": pr.note, "outputs": outputs})
        body = {"weights": self.weights_name, "input": {"file": photo.name, "size": list(photo.size),
                                                        "faces_found": len(photo.faces),
                                                        "searched_for": "the largest face" if largest_only(p.face)
                                                        else "every face"},
                "match_input": p.match_input, "faces": faces}
        if p.paste_back:
            body["pasted_back"] = self.pasted(photo, prepared, results, next(iter(opts)))
        return body

    def run(self, data: bytes, filename: str, p: Params, timeout: float | None = 300.0) -> dict:
        """One request, blocking."""
        opts, prepared, photo = self.prepare(data, filename, p)
        tickets = self.submit(opts, prepared)
        try:
            for _, _, t in tickets:
                t.wait(timeout)
        finally:
            for _, _, t in tickets:
                t.cancel()
        return self.body(p, opts, prepared, photo, tickets)

    @staticmethod
    def pasted(photo, prepared, results, mode) -> dict | None:
        """Every decoded face pasted back into the photo at the model's scale (faces.paste_plan)."""
        from .. import faces as F
        chosen = [pr for pr in prepared if pr.chosen is not None]
        if not chosen:
            return None  # an 8x8 or 32x32 input: no photo around it
        img = photo.image
        plan = F.paste_plan(img.size, [pr.chosen for pr in chosen], own_size=photo.size)
        whole = F.paste_back(img, [pr.chosen for pr in chosen], [results[(id(pr), mode)] for pr in chosen],
                             plan.scale)
        return {"mode": mode, "scale": round(plan.scale, 5), "note": plan.note, "png": png_base64(np.asarray(whole))}


def make_api(upscaling: Upscaling, upload_mb: int = UPLOAD_MB, serial: bool = False):
    """The FastAPI app of the HTTP API (mount it at API_PATH). serial: one request at a time,
    whole (detection and decode), as the page served before the decode service: the benchmark's
    'before'."""
    import asyncio
    import os

    from fastapi import FastAPI, File, Form, Request, UploadFile
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse

    app = FastAPI(title="sr-blockwise", version="1",
                  description="8x8 -> 32x32 face super-resolution by blockwise parallel decoding. POST a photo to "
                              "/upscale; every face found is aligned to the training framing and decoded.")
    one_at_a_time = asyncio.Lock() if serial else None

    limit = upload_mb * 2**20

    app.add_middleware(RefuseLarge, limit=limit + 2**16, message=f"upload over {upload_mb} MB")

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)

    @app.post("/upscale", summary="Upscale the faces of a photo",
              responses={413: {"description": "upload too large"}, 415: {"description": "not an image"},
                         422: {"description": "no face found, or a bad option"},
                         503: {"description": "queue full: retry after the Retry-After header's seconds"}})
    async def upscale(request: Request,
                      image: UploadFile = File(..., description="a photo (JPEG, PNG, WebP, BMP), or an "
                                                                "8x8 / 32x32 face"),
                      modes: str = Form("exact,approx", description=f"comma-separated, of {', '.join(API_MODES)}"),
                      k: int | None = Form(None, description="block size (default: the page's)"),
                      eps: int = Form(2, description="approx: tolerance in intensity levels"),
                      face: str = Form("", description="'' the largest face, a number, 'all', 'centre square' "
                                                       "or a box 'left, top, right, bottom' in the photo's pixels"),
                      paste_back: bool = Form(False, description="also the photo with the faces pasted back "
                                                                 "(the first mode's)"),
                      match_input: bool = Form(True, description="shift each 4x4 block to average to its input pixel"),
                      guidance: float | None = Form(None, description="input guidance (default: the weights')"),
                      guard: float | None = Form(None, description="cell guard in levels (0: off; samples: off)"),
                      temperature: float = Form(0.8, description="sample: temperature"),
                      seed: int = Form(0, description="sample: seed")):
        data = await image.read(limit + 1)
        if len(data) > limit:
            raise ApiError(413, f"upload over {upload_mb} MB")
        p = Params(modes, k, eps, face, paste_back, match_input, guidance, guard, temperature, seed)
        if one_at_a_time is None:
            return await serve_one(request, data, image.filename, p)
        async with one_at_a_time:
            return await serve_one(request, data, image.filename, p)

    async def serve_one(request, data: bytes, filename: str, p: Params):
        # detection in a worker thread, beside the decodes; waiting here, not in a thread, so that
        # a client that leaves frees its faces' places
        opts, prepared, photo = await run_in_threadpool(upscaling.prepare, data, filename, p)
        tickets = upscaling.submit(opts, prepared)
        try:
            waited = 0.0
            while not all(t.done.is_set() for _, _, t in tickets):
                await asyncio.sleep(POLL)
                waited += POLL
                if waited >= 0.5:
                    waited = 0.0
                    if await request.is_disconnected():
                        return JSONResponse({"error": "client left"}, status_code=499)
            errors = [t.error for _, _, t in tickets if t.error is not None]
            if errors:
                raise errors[0]
            return await run_in_threadpool(upscaling.body, p, opts, prepared, photo, tickets)
        finally:
            for _, _, t in tickets:
                t.cancel()

    @app.get("/health", summary="The decode queue and the server's memory")
    def health():
        return {**upscaling.service.info(), **memory(os.getpid())}

    return app


class RefuseLarge:
    """ASGI middleware: 413 for a request whose Content-Length passes limit, before its upload is
    read and spooled. Plain ASGI, not Starlette's BaseHTTPMiddleware, under which an endpoint
    cannot see its client leave."""

    def __init__(self, app, limit: int, message: str):
        self.app, self.limit, self.message = app, limit, message

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            size = dict(scope["headers"]).get(b"content-length", b"")
            if size.isdigit() and int(size) > self.limit:
                from fastapi.responses import JSONResponse
                return await JSONResponse({"error": self.message}, status_code=413)(scope, receive, send)
        return await self.app(scope, receive, send)


def memory(pid: int) -> dict:
    """A process's resident memory now and at its peak, in MB (Linux /proc; empty elsewhere)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    kb = {l.split(":")[0]: int(l.split()[1]) for l in lines if l.startswith(("VmRSS", "VmHWM"))}
    return {"rss_mb": round(kb.get("VmRSS", 0) / 1024, 1), "peak_rss_mb": round(kb.get("VmHWM", 0) / 1024, 1)}
