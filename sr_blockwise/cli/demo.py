"""`sr-blockwise demo`: the live upscaling web page and the HTTP API on one server. The page is
apps/demo.py's, imported when the command runs: `sr-blockwise --help` stays fast, and an install
without gradio says which extra brings it."""
from __future__ import annotations

import os

from pathlib import Path

from ..api import DEFAULT_DTYPE, dtype_name
from ..data import DEFAULT_DATA
from ..serving.live import DECODE_THREADS


def cmd_demo(args) -> int:
    import torch

    from apps import check_port

    from ..serving import live
    from ..api import Upscaler
    from ..checkpoints import WeightsError
    from ..decoding import engine
    from ..examples import builtin_examples, celeba_examples
    from ..serving.service import DecodeService, limit_malloc_arenas

    check_port(args.host, args.port)  # before the weights load
    try:  # on the CPU: the page decodes one image at a time, live
        up = Upscaler(args.weights, device="cpu", dtype=args.dtype)
    except WeightsError as e:  # the CLI prints ValueErrors as one line
        raise WeightsError(f"{e}. Pass --weights with a weights name, a .json path or a training "
                           "checkpoint .pt") from None
    model, name = up.model, up.weights
    if args.threads:  # before any worker thread starts: each begins with this count (DECODE_THREADS)
        torch.set_num_threads(args.threads)
    if not engine.available():  # built here, once, rather than in the first user's decode
        print("sr-blockwise demo: the native decoding engine is not available; decoding with PyTorch")
    data = args.data or DEFAULT_DATA / "celeba32.npz"
    if not args.no_celeba and Path(data).exists():
        print(f"sr-blockwise demo: reading held-out CelebA faces from {data}")
    celeba = [] if args.no_celeba else celeba_examples(data)
    if args.data and not celeba:
        print(f"sr-blockwise demo: no CelebA faces at {args.data}; showing built-in examples only")
    limit_malloc_arenas()  # before the server's threads start
    if args.one_at_a_time:  # the benchmark's 'before': every face decoded alone, every photo read anew
        live.PHOTO_CACHE = 0
    if args.decode_workers < 1:
        raise ValueError(f"--decode-workers {args.decode_workers}: at least 1")
    service = DecodeService(model, max_waiting=args.max_waiting, max_batch=1 if args.one_at_a_time else args.max_batch,
                            workers=1 if args.one_at_a_time else args.decode_workers)
    from apps.demo import build_app, launch  # gradio: without it, the CLI names the extra that brings it
    demo = build_app(model, Path(str(name)).stem, builtin_examples(), celeba, time_limit=args.time_limit,
                     service=service, serial=args.one_at_a_time)
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
    d.add_argument("--max-queue", type=int, default=64, help="the page's waiting requests beyond this are refused")
    d.add_argument("--max-waiting", type=int, default=64,
                   help="faces waiting to decode (the page's and the HTTP API's) beyond this are refused "
                        "(the API: 503 with Retry-After)")
    d.add_argument("--max-batch", type=int, default=4,
                   help="faces decoded together, at most (a worker decodes on one core, where batches of 1-4 "
                        "served more faces a second than 16)")
    d.add_argument("--decode-workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="batches of different settings decoded at once, each on one core (default: this "
                        "machine's cores)")
    d.add_argument("--one-at-a-time", action="store_true",
                   help="serve the HTTP API one request at a time, each face decoded alone and each photo "
                        "searched anew: the server before the decode service, for bench-serve's comparison")
    d.add_argument("--time-limit", type=float, default=300.0, help="seconds one decode may take")
    d.add_argument("--threads", type=int, default=DECODE_THREADS,
                   help="torch CPU threads of a decode on the PyTorch step (models the native engine does not "
                        "run; 0: torch's default). 1 by default: the demo decodes in worker threads, where 2 "
                        "threads ran several times slower than 1 on a 2-core machine (the native engine uses 1 "
                        "thread there whatever this says)")
    d.add_argument("--dtype", default=DEFAULT_DTYPE, type=dtype_name, choices=["float32", "bfloat16"],
                   help=f"the weights' dtype (default {DEFAULT_DTYPE}, as the batch command and the API load them: "
                        "the page gives their faces for the same settings; float32 gives other faces of the "
                        "same quality, and bfloat16 takes 1.09-1.14x its time at batch 1 on a processor "
                        "without AMX)")
    d.set_defaults(func=cmd_demo)
