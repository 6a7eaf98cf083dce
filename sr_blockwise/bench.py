"""Decoding benchmarks: what one model call costs against the tokens it verifies, and seconds per
image for greedy and blockwise decoding (with an oracle run: every proposal accepted, the upper
bound on speedup for that k). Variants are compared as ratios within one run: machines are noisy.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from .decoding import engine as native
from .decoding import DecodeOptions, decode
from .decoding.engine import MAX_TOKENS
from .model import SEQ_LEN, ImageTransformerSR, preset


def time_call(model: ImageTransformerSR, n_tokens: int, batch: int = 1, reps: int = 50, pos: int = 1500,
              engine: str = "native", propose: bool = True, stage_ticks: list | None = None) -> float:
    """Median seconds of one blockwise call with k = n_tokens as `decode` makes it, for `batch`
    images at a mid-image position: feed n tokens per image, p1's logits at all of them, accept
    (the oracle rule: all of them), commit, and (propose) draft the next block's k proposals.
    stage_ticks (native engine): a list that gets the timed calls' cycle counts per stage
    (engine.STAGES) appended."""
    torch.manual_seed(0)
    src = torch.randint(0, 256, (batch, 192))
    k = min(n_tokens, MAX_TOKENS)
    times = []
    with torch.no_grad():
        if engine == "native":
            b = native.Batch(model, src, k)
            opts = b.options("oracle")
            b.tokens[:, :pos] = torch.randint(0, 256, (batch, pos))
            b.props[:] = torch.randint(0, 256, (batch, k))
            rows = torch.arange(batch, dtype=torch.int64)
            ticks = b.time_stages() if stage_ticks is not None else None
            for i in range(reps + 5):
                b.t[:] = pos
                rows[:] = torch.arange(batch)
                if i == 5 and ticks is not None:
                    ticks.zero_()  # the warm-up calls' stages left out
                t0 = time.perf_counter()
                b.iterate(opts, rows, batch, propose=propose)
                if i >= 5:
                    times.append(time.perf_counter() - t0)
            if ticks is not None:
                stage_ticks.append(ticks.clone())
        else:  # the torch engine's call: model.step, p1's logits, the heads
            toks = torch.randint(0, 256, (batch, n_tokens))
            prefix = torch.randint(0, 256, (batch, pos))
            p = torch.full((batch,), pos)
            cache = model.new_cache(src, max_extra=16)
            for i in range(reps + 5):
                t0 = time.perf_counter()
                h = model.step(cache, toks, p)
                model.logits(h, src, p[:, None] + torch.arange(n_tokens)).argmax(-1)
                if propose:
                    model.draft_heads(h[:, 0], min(n_tokens, model.cfg.n_blockwise), src, p, prefix)
                if i >= 5:
                    times.append(time.perf_counter() - t0)
    return statistics.median(times)


def call_cost_table(model: ImageTransformerSR, tokens=(1, 2, 4, 7, 11), batches=(1, 16, 64),
                    reps: int = 50, torch_model: ImageTransformerSR | None = None, rounds: int = 3) -> list[dict]:
    """Cost of one call against the tokens it verifies per image, per batch size, on the native
    engine (and, with torch_model, the torch engine at batch 1 and 16: the comparison). Each
    native cost is the fastest of `rounds` medians, the token counts timed in turn in every
    round: a slow moment of a shared machine then spoils one median, not a whole row of ratios."""
    rows = []
    engines = [("native", model)] + ([("torch", torch_model)] if torch_model is not None else [])
    for engine, m in engines:
        for B in batches:
            if engine == "torch" and B > 16:
                continue
            r = max(15, reps // B) if engine == "native" else max(3, reps // (4 * B))
            sec = {n: float("inf") for n in dict.fromkeys((1, *tokens))}
            for _ in range(rounds if engine == "native" else 1):  # the torch step: one round of its slow calls
                for n in sec:
                    sec[n] = min(sec[n], time_call(m, n, B, r, engine=engine))
            for n in tokens:
                rows.append({"engine": engine, "dtype": _dtype_name(m, engine), "batch": B, "tokens": n,
                             "ms": sec[n] * 1e3, "vs_1_token": sec[n] / sec[1]})
    return rows


def call_breakdown(model: ImageTransformerSR, k: int = 6, batches=(1, 16), reps: int = 30) -> list[dict]:
    """Where a k-token blockwise call's time goes on the native engine, in ms per call: the call
    through ctypes from Python (an empty call's cost), then each stage of the engine's call
    (engine.STAGES: the decoder step's embedding, QKV products, KV-cache writes, self- and
    cross-attention, the other linear layers, norms and GELU; p1's logits, the acceptance rule
    and commit, the heads' drafting), each stage's share of the cycles counted in the calls
    (engine.Batch.time_stages) times the median call's time less the empty call's. The first
    thread counts the cycles: where a call goes by image (engine.IMAGES_PER_THREAD), the shares
    are those of its own images' work."""
    out = []
    for B in batches:
        r = max(15, reps // B)
        ticks = []
        whole = time_call(model, k, B, r, stage_ticks=ticks)
        b = native.Batch(model, torch.zeros(B, 192, dtype=torch.int64), k)
        rows = torch.arange(B, dtype=torch.int64)
        opts = b.options()
        b.t[:] = SEQ_LEN  # every image done: the call does nothing but cross into C and back
        empty = statistics.median(_timed(lambda: b.iterate(opts, rows, B), 200))
        share = ticks[0] / ticks[0].sum()
        row = {"batch": B, "k": k, "call_ms": whole * 1e3, "host_ms": empty * 1e3}
        row.update({f"{name}_ms": float(f) * (whole - empty) * 1e3 for name, f in zip(native.STAGES, share)})
        out.append(row)
    return out


def _timed(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _dtype_name(m, engine):
    if engine == "native":
        w = str(next(m.parameters()).dtype)[6:]
        return "float32" if w == "float32" else f"float32 ({w} weights)"
    return str(next(m.parameters()).dtype)[6:]


def _copy_for(model_fp32: ImageTransformerSR, dtype) -> ImageTransformerSR:
    m = ImageTransformerSR(model_fp32.cfg)
    m.load_state_dict(model_fp32.state_dict())
    return m.for_inference(dtype)


def decode_table(model: ImageTransformerSR, lr: np.ndarray, ks=(2, 6, 10),
                 modes=("exact", "exact-heads", "eps=2", "eps-window=2", "oracle"), prior_weight: float = 1.0,
                 engine: str = "auto") -> list[dict]:
    """Seconds per image for greedy (the faster of a run before and one after the other modes) and
    each (k, mode), batch as given; speedup vs greedy, and its share of the ideal (the call
    reduction, mean block). prior_weight: input guidance (DecodeOptions.prior_weight), the same
    for every row. exact-heads beside exact: what recycled proposals add to the heads' blocks;
    eps-window=2 beside eps=2: approximate mode as the apps run it (window proposals)."""
    w = prior_weight
    # warm-up at the batch's own shape, untimed: otherwise greedy, timed first, pays the first calls
    decode(model, lr, DecodeOptions(k=2, rule="oracle", prior_weight=w), engine=engine)
    g = decode(model, lr, DecodeOptions(k=1, prior_weight=w), engine=engine)
    rows = []
    for k in ks:
        if k > model.cfg.n_blockwise:
            continue
        for mode in modes:
            opts = parse_mode(mode, k, w)
            r = decode(model, lr, opts, engine=engine)
            rows.append({"engine": r.extra["engine"], "mode": mode, "k": opts.k, "s_per_image": r.seconds / len(lr),
                         "calls": float(np.mean([st.calls for st in r.stats])),
                         "mean_block": float(np.mean([s.mean_block for s in r.stats])),
                         "same_as_greedy": bool(np.array_equal(r.images, g.images)) if opts.is_exact else None})
    # greedy, every speedup's baseline, is timed before and after the other modes and the faster
    # run kept: a slow moment of a shared machine in that one run would inflate every speedup
    g_s = min(g.seconds, decode(model, lr, DecodeOptions(k=1, prior_weight=w), engine=engine).seconds) / len(lr)
    for r in rows:
        r.update(images_per_s=1 / r["s_per_image"], speedup=g_s / r["s_per_image"],
                 of_ideal=g_s / r["s_per_image"] / r["mean_block"])
    return [{"engine": g.extra["engine"], "mode": "greedy", "k": 1, "s_per_image": g_s, "images_per_s": 1 / g_s,
             "calls": g.stats[0].calls, "mean_block": 1.0, "speedup": 1.0, "of_ideal": 1.0}] + rows


def parse_mode(mode: str, k: int, prior_weight: float) -> DecodeOptions:
    """A mode in the decode-mode grammar (decoding.DecodeOptions.parse), k and the input guidance
    filled in where it gives none."""
    return DecodeOptions.parse(mode, k=k, prior_weight=prior_weight)


def decoder_flops_per_token(cfg) -> float:
    """Multiply-adds x 2 of the decoder for one token at a mid-image position (attention over
    ~1.5 blocks of keys and the 192 input tokens) plus p1's output layer."""
    d, ff = cfg.d_model, cfg.d_ff
    per_layer = d * 3 * d + 3 * d * d + 2 * d * ff + 2 * d * (1.5 * cfg.block_len) + 2 * d * 192
    return 2 * (cfg.n_dec_layers * per_layer + d * 256)


def machine() -> str:
    """The processor by its model name (machines sold under one name differ), threads, torch."""
    from .evaluate.run import machine_info
    return f"{machine_info('cpu')['cpu']}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def print_table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    text = "\n".join(lines)
    print(text)
    return text


def _bench_model(weights: str | None) -> tuple[ImageTransformerSR, str]:
    """The float32 model to time and how the report names it."""
    from .checkpoints import load_model

    if weights:
        return load_model(weights, dtype=torch.float32, for_inference=False), weights
    # the cpu preset's cost does not depend on training: random weights time the same
    torch.manual_seed(0)
    return ImageTransformerSR(preset("cpu")), "cpu preset, random weights"


def _check_bench_args(fp32: ImageTransformerSR, n_images: int, reps: int, batches, ks, prior_weight: float) -> None:
    """Refuse bad arguments before minutes of measuring."""
    for name, v in (("--images", n_images), ("--reps", reps), ("--batch-size", min(batches))):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    heads = fp32.cfg.n_blockwise
    if any(not 1 <= k <= heads for k in ks):
        raise ValueError(f"--k {','.join(map(str, ks))}: these weights have {heads} blockwise heads, "
                         f"so each k must be in 1..{heads}")
    DecodeOptions(prior_weight=prior_weight).validate()  # e.g. a negative one: refused here


def _bench_inputs(data, n: int) -> tuple[np.ndarray, str]:
    """n 8x8 inputs: held-out faces, or random ones where no CelebA data is found; and which."""
    from .data import downsample_8, load_faces

    try:
        faces = load_faces(data).part("test")
        return downsample_8(faces.images[:n]), "held-out faces"
    except (FileNotFoundError, ValueError):
        return (np.random.default_rng(0).integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
                "random inputs (no CelebA data found)")


def _native_decode_tables(model, lr, ks, batches, n_images: int, src_note: str,
                          prior_weight: float) -> tuple[list[dict], list[str]]:
    """Seconds per face on the native engine at each batch size, averaged over the batches of
    faces; the rows and each table's markdown."""
    decode_rows, md = [], []
    for B in batches:
        n = max(n_images, B)
        print(f"\n## Seconds per face, native engine, batch {B}, {n} {src_note} (greedy: the faster of a run "
              "before and one after the other modes)")
        per = [decode_table(model, lr[i:i + B], ks, prior_weight=prior_weight) for i in range(0, n, B)]
        merged = _average(per)
        for r in merged:
            r["batch"] = B
        md.append(print_table(merged, ["mode", "k", "s_per_image", "images_per_s", "calls", "mean_block",
                                       "speedup", "of_ideal", "same_as_greedy"]))
        decode_rows += merged
    return decode_rows, md


def _torch_decode_table(model, lr, ks, torch_images: int, trees, prior_weight: float) -> tuple[list[dict], str]:
    """Seconds per face on the torch engine at batch 1 (with trees at the largest k); the rows and
    their markdown."""
    print(f"\n## Seconds per face, torch engine (before the native engine), batch 1, {torch_images} face(s)")
    per = [decode_table(model, lr[i:i + 1], (6,), ("exact", "eps=2", "oracle"), prior_weight, "torch")
           for i in range(torch_images)]
    merged = _average(per)
    if trees:  # on a CPU trees run on the torch engine (decoding/tree.py)
        modes = tuple(f"{m}:tree={n}" for n in trees for m in ("exact", "eps=2"))
        merged += _average([decode_table(model, lr[i:i + 1], (max(ks),), modes, prior_weight, "torch")[1:]
                            for i in range(torch_images)])
    for r in merged:
        r["batch"] = 1
    return merged, print_table(merged, ["engine", "mode", "k", "s_per_image", "calls", "mean_block", "speedup",
                                        "of_ideal", "same_as_greedy"])


def _machine_use(model, decode_rows: list[dict], batches) -> dict:
    """Greedy's images/s at the largest batch as a share of this machine's fp32 and bf16
    matrix-product rates, printed and returned."""
    big = [r for r in decode_rows if r["batch"] == max(batches) and r["mode"] == "greedy" and r["engine"] == "native"][0]
    # the engine's products run in float32, or on AMX tiles in bf16 where the processor has them
    # (engine.uses_amx): both rates, as torch's largest products reach them
    rate, rate_bf16 = matmul_rate(torch.float32), matmul_rate(torch.bfloat16)
    flops = decoder_flops_per_token(model.cfg) * SEQ_LEN * big["images_per_s"]
    machine_use = {"batch": max(batches), "greedy_images_per_s": big["images_per_s"],
                   "decoder_gflops": flops / 1e9, "fp32_matmul_gflops": rate / 1e9, "share": flops / rate,
                   "bf16_matmul_gflops": rate_bf16 / 1e9, "share_bf16": flops / rate_bf16,
                   "amx": bool(native.available() and native.uses_amx() and native.packed(model).bf16)}
    print(f"\ngreedy at batch {max(batches)}: {big['images_per_s']:.2f} images/s, {flops / 1e9:.1f} GFLOP/s "
          f"of decoder arithmetic = {flops / rate:.1%} of this machine's fp32 matrix-product rate "
          f"({rate / 1e9:.0f} GFLOP/s), {flops / rate_bf16:.1%} of its bf16 rate ({rate_bf16 / 1e9:.0f} GFLOP/s; "
          f"the engine's {'bf16 products run on the AMX tiles' if machine_use['amx'] else 'products are float32 multiply-adds'})")
    return machine_use


def run(weights: str | None, n_images: int, batch: int, reps: int, out: str | None, ks, data=None,
        prior_weight: float | None = None, dtype: str = "float32", batches=(1, 16, 64),
        torch_images: int = 1, trees=()) -> dict:
    """The whole benchmark: call cost (native engine at batch 1/16/64, torch at 1/16), the
    breakdown of a call at each k of ks, seconds per face at each batch size in `batches` (n_images faces,
    at least one batch each), the torch engine's seconds per face on torch_images faces at batch
    1 (0: skip; with `trees`, exact and eps=2 trees of those sizes at the largest k too), images/s at the largest batch and its share of the fp32 and bf16 matrix-product rates.
    prior_weight None: the apps' default (decoding.DEFAULT_PRIOR_WEIGHT) where the model has the
    input prior, else 1. dtype: of the weights (the native engine computes in float32)."""
    from .decoding import default_prior_weight

    fp32, label = _bench_model(weights)
    if prior_weight is None:
        prior_weight = default_prior_weight(fp32)
    _check_bench_args(fp32, n_images, reps, batches, ks, prior_weight)
    model = _copy_for(fp32, getattr(torch, dtype))
    print(f"# bench-decode: {label}; {machine()}; input guidance (prior weight) {prior_weight:g}")
    print(f"\n## Cost of one call vs tokens verified per image (the fastest of 3 rounds' medians of max(15, {reps} / "
          f"batch size) calls; torch: one median of max(3, {reps} / (4 x batch size)))")
    calls = call_cost_table(model, batches=batches, reps=reps, torch_model=model if torch_images else None)
    calls_md = print_table(calls, ["engine", "dtype", "batch", "tokens", "ms", "vs_1_token"])
    print(f"\n## Where a call's time goes at k = {', '.join(map(str, ks))} (native engine, ms per call)")
    parts = [row for k in ks for row in call_breakdown(model, k, batches=[b for b in batches if b <= 16])]
    parts_md = print_table(parts, ["batch", "k", "call_ms", "host_ms", *[f"{n}_ms" for n in native.STAGES]])
    lr, src_note = _bench_inputs(data, max(n_images, max(batches)))
    decode_rows, md = _native_decode_tables(model, lr, ks, batches, n_images, src_note, prior_weight)
    if torch_images:
        torch_rows, torch_md = _torch_decode_table(model, lr, ks, torch_images, trees, prior_weight)
        md.append(torch_md)
        decode_rows += torch_rows
    machine_use = _machine_use(model, decode_rows, batches)
    result = {"weights": label, "machine": machine(), "call_cost": calls, "breakdown": parts,
              "decode": decode_rows, "machine_use": machine_use, "images": int(n_images),
              "prior_weight": prior_weight, "dtype": dtype}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1))
        Path(out).with_suffix(".md").write_text("\n\n".join([calls_md, parts_md, *md]) + "\n")
    return result


def _average(tables: list[list[dict]]) -> list[dict]:
    merged = []
    for j, r in enumerate(tables[0]):
        m = dict(r)
        for key in ("s_per_image", "images_per_s", "calls", "mean_block", "speedup", "of_ideal"):
            if key in r:
                m[key] = float(np.mean([t[j][key] for t in tables]))
        if r.get("same_as_greedy") is not None:
            m["same_as_greedy"] = all(t[j]["same_as_greedy"] for t in tables)
        merged.append(m)
    return merged


# ---------------------------------------------------------------- training throughput

def matmul_rate(dtype: torch.dtype, n: int = 2048, seconds: float = 0.5) -> float:
    """Measured FLOP/s of a large square matmul (n x n, or smaller where one product of the next
    size up would take over 0.5 s: a processor without bf16 instructions multiplies bf16 far
    slower than float32), products repeated for `seconds`: the ceiling training and decoding
    are compared against."""
    size = 256
    while True:
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        a @ b  # warm-up
        t0 = time.perf_counter()
        a @ b
        once = time.perf_counter() - t0
        if size >= n or once * 8 > 0.5:
            break
        size *= 2
    reps, t0 = 0, time.perf_counter()
    while reps == 0 or time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * size**3 * reps / (time.perf_counter() - t0)


def train_throughput(preset_name: str = "cpu", batch: int = 8, steps: int = 5, stage: str = "base",
                     head_frac: float = 0.1) -> dict:
    """Images/s of real training steps (bf16 autocast, the heads' loss on head_frac of the
    positions, deterministic algorithms on as in `train`) and the FLOPs they do, counted by
    torch's FlopCounterMode, as a fraction of the measured large-matmul rate (bf16 or float32,
    the faster). stage: "base" or "finetune" (the heads stage, which freezes the base, is not
    what this step does)."""
    if stage not in ("base", "finetune"):
        raise ValueError(f"stage {stage!r}: bench-train times the base or finetune stage")
    from torch.utils.flop_counter import FlopCounterMode

    from .train import TrainConfig, TrainingLoss, deterministic_algorithms

    torch.manual_seed(0)
    model = ImageTransformerSR(preset(preset_name))
    cfg = TrainConfig(preset=preset_name, stage=stage, batch_size=batch, head_frac=head_frac)
    loss_fn = TrainingLoss(model, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    src = torch.randint(0, 256, (batch, 192))
    tgt = torch.randint(0, 256, (batch, 3072))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            base, heads, _ = loss_fn(src, tgt, torch.Generator().manual_seed(0))
        opt.zero_grad()
        (base + heads).backward()
        opt.step()

    restore_determinism = deterministic_algorithms()  # as train() runs its steps
    try:
        counter = FlopCounterMode(display=False)
        with counter:
            step()
        flops = counter.get_total_flops()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sec = (time.perf_counter() - t0) / steps
    finally:
        restore_determinism()
    # the faster dtype's rate: a processor without bf16 instructions multiplies bf16 far slower
    # than float32, and training (float32 where autocast leaves it) passed its bf16 rate
    rates = {"bfloat16": matmul_rate(torch.bfloat16), "float32": matmul_rate(torch.float32)}
    fastest = max(rates, key=rates.get)
    peak = rates[fastest]
    return {"preset": preset_name, "stage": stage, "head_frac": head_frac, "batch": batch,
            "seconds_per_step": sec, "images_per_s": batch / sec,
            "gflop_per_image": flops / batch / 1e9, "achieved_gflops": flops / sec / 1e9,
            "matmul_gflops": peak / 1e9, "matmul_dtype": fastest, "fraction_of_matmul_rate": flops / sec / peak,
            "machine": machine()}
