"""`sr-blockwise bench-serve`: the demo server's HTTP API under many clients at once
(sr_blockwise/serving/bench.py)."""
from __future__ import annotations

import os


def cmd_bench_serve(a) -> int:
    import json
    import tempfile
    from pathlib import Path

    from ..serving import bench as B

    levels = [int(n) for n in a.clients.split(",")]
    if not levels or min(levels) < 1 or a.seconds <= 0:
        raise ValueError("--clients: client counts of 1 or more, comma-separated; --seconds: above 0")
    photo = Path(a.photo).read_bytes() if a.photo else B.example_photo()
    fields = {"modes": a.modes, "k": a.k, "eps": a.eps, "face": a.face}
    servers = [("url", a.url, None)] if a.url else (
        ([("before", None, ["--one-at-a-time"])] if a.before else [])
        + [(f"after, {n} worker{'s' * (n != 1)}" if len(a.decode_workers) > 1 else "after", None,
            ["--max-waiting", str(a.max_waiting), "--max-batch", str(a.max_batch), "--decode-workers", str(n)])
           for n in a.decode_workers])
    logs = Path(tempfile.mkdtemp(prefix="sr-blockwise-bench-serve-"))
    rows, reference = [], None
    print(f"bench-serve: {', '.join(map(str, levels))} clients, {a.seconds:g} s each; {len(photo):,} byte photo; "
          f"{fields}; {'the same bytes' if a.same_photo else 'new bytes'} every request")
    print("| " + " | ".join(B.HEADER) + " |\n|" + "---|" * len(B.HEADER))
    for name, url, extra in servers:
        proc = None
        if url is None:
            proc, url = B.start_server(extra, a.weights, logs / f"{name}.log")
        try:
            levels_done, alone = B.bench_server(url, name, levels, a.seconds, photo, fields, a.same_photo, reference)
            reference = reference or alone
            rows += [lv.row() for lv in levels_done]
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    print("\n" + B.table(rows))
    for name in dict.fromkeys(r["server"] for r in rows):
        mine = {r["clients"]: r for r in rows if r["server"] == name}
        lo, hi = mine[min(mine)], mine[max(mine)]
        if lo["peak_rss_mb"]:
            print(f"{name}: peak memory at {hi['clients']} clients / at {lo['clients']}: "
                  f"{hi['peak_rss_mb'] / lo['peak_rss_mb']:.2f}x")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"settings": {**fields, "seconds": a.seconds, "clients": levels,
                                                         "same_photo": a.same_photo, "photo_bytes": len(photo)},
                                            "rows": rows}, indent=1))
        print(f"bench-serve: wrote {a.json}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench-serve", help="many clients at once against the demo server's HTTP API",
                       description="Start `sr-blockwise demo` on localhost (or use --url), run 1 / 8 / 32 / 64 "
                                   "concurrent clients posting a photo for a bounded time each, and report served, "
                                   "refused, errors, wrong outputs, latency, requests/s, decodes/s and the "
                                   "server's peak memory.")
    p.add_argument("--url", default=None, help="a running server (http://host:port) instead of starting one")
    p.add_argument("--clients", default="1,8,32,64", help="concurrent clients per level, comma-separated")
    p.add_argument("--seconds", type=float, default=20.0, help="how long each level runs")
    p.add_argument("--photo", default=None,
                   help="the photo to post (default: a built-in 2400x1400 photo of four faces)")
    p.add_argument("--modes", default="exact,approx", help="the API's modes per request")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--eps", type=int, default=2)
    p.add_argument("--face", default="", help="the API's face choice ('' the largest, 'all', ...)")
    p.add_argument("--before", action="store_true",
                   help="first a server as before the decode service (demo --one-at-a-time), in the same run")
    p.add_argument("--same-photo", action="store_true",
                   help="post the same bytes every time (the server may reuse an earlier upload's faces)")
    p.add_argument("--weights", default=None, help="the started server's weights (default: the shipped default)")
    p.add_argument("--max-waiting", type=int, default=64, help="the started server's queue of faces")
    p.add_argument("--max-batch", type=int, default=4, help="the started server's faces per decode")
    p.add_argument("--decode-workers", type=lambda s: [int(n) for n in s.split(",")],
                   default=[len(os.sched_getaffinity(0))],
                   help="the started server's decode workers; several (e.g. 1,2): a server for each, compared "
                        "in one run (default: this machine's cores)")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.set_defaults(func=cmd_bench_serve)
