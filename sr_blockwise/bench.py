"""Decoding benchmarks: what one model call costs against the tokens it verifies, and seconds per
image for greedy and blockwise decoding (with an oracle run: every proposal accepted, the upper
bound on speedup for that k). Variants are compared as ratios within one run: machines are noisy.
"""
from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from .decoding import DecodeOptions, decode
from .model import ImageTransformerSR, preset


def time_call(model: ImageTransformerSR, n_tokens: int, batch: int = 1, reps: int = 50, pos: int = 1500) -> float:
    """Median seconds of one decoding call as `decode` makes it with k = n_tokens: feed n tokens
    per image at a mid-image position, p1's logits at all of them, and the next block's k
    proposals at one of them (heads capped at the model's K)."""
    src = torch.randint(0, 256, (batch, 192))
    toks = torch.randint(0, 256, (batch, n_tokens))
    prefix = torch.randint(0, 256, (batch, pos))  # the tokens decoded before, for nbr_prior
    p = torch.full((batch,), pos)
    times = []
    with torch.no_grad():
        cache = model.new_cache(src, max_extra=16)
        for i in range(reps + 5):
            t0 = time.perf_counter()
            h = model.step(cache, toks, p)
            model.logits(h, src, p[:, None] + torch.arange(n_tokens)).argmax(-1)
            model.draft_heads(h[:, 0], min(n_tokens, model.cfg.n_blockwise), src, p, prefix)  # next block's proposals
            if i >= 5:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def call_cost_table(model_fp32: ImageTransformerSR, max_k: int = 10, reps: int = 50) -> list[dict]:
    rows = []
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        m = _copy_for(model_fp32, dtype)
        base = time_call(m, 1, reps=reps)
        for n in range(1, max_k + 2):
            s = base if n == 1 else time_call(m, n, reps=reps)
            rows.append({"dtype": name, "tokens": n, "ms": s * 1e3, "vs_1_token": s / base})
    return rows


def _copy_for(model_fp32: ImageTransformerSR, dtype) -> ImageTransformerSR:
    m = ImageTransformerSR(model_fp32.cfg)
    m.load_state_dict(model_fp32.state_dict())
    return m.for_inference(dtype)


def decode_table(model: ImageTransformerSR, lr: np.ndarray, ks=(2, 4, 6, 8, 10),
                 modes=("exact", "eps=2", "oracle"), prior_weight: float = 1.0) -> list[dict]:
    """Seconds per image for greedy and each (k, mode), batch as given; speedup vs greedy.
    prior_weight: input guidance (DecodeOptions.prior_weight), the same for every row."""
    w = prior_weight
    # warm-up at the batch's own shape, untimed: otherwise greedy, timed first, pays the first calls
    decode(model, lr, DecodeOptions(k=2, rule="oracle", prior_weight=w))
    g = decode(model, lr, DecodeOptions(k=1, prior_weight=w))
    g_s = g.seconds / len(lr)
    rows = [{"mode": "greedy", "k": 1, "s_per_image": g_s, "calls": g.stats[0].calls,
             "mean_block": 1.0, "speedup": 1.0, "ideal": 1.0}]
    for k in ks:
        if k > model.cfg.n_blockwise:
            continue
        for mode in modes:
            if mode == "exact":
                opts = DecodeOptions(k=k)
            elif mode == "oracle":
                opts = DecodeOptions(k=k, rule="oracle")
            else:
                opts = DecodeOptions(k=k, rule="eps", eps=int(mode.split("=")[1]))
            r = decode(model, lr, replace(opts, prior_weight=w))
            mb = float(np.mean([s.mean_block for s in r.stats]))
            s = r.seconds / len(lr)
            rows.append({"mode": mode, "k": k, "s_per_image": s,
                         "calls": float(np.mean([st.calls for st in r.stats])), "mean_block": mb,
                         "speedup": g_s / s, "ideal": mb, "of_ideal": (g_s / s) / mb})
    return rows


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def print_table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    text = "\n".join(lines)
    print(text)
    return text


def run(weights: str | None, n_images: int, batch: int, reps: int, out: str | None, ks, data=None,
        prior_weight: float | None = None, dtype: str = "bfloat16") -> dict:
    """prior_weight None: the apps' default (decoding.DEFAULT_PRIOR_WEIGHT) where the model has the
    input prior, else 1. dtype: of the decoding table (the call-cost table times both)."""
    from .checkpoints import load_model
    from .data import downsample_8, load_faces
    from .decoding import default_prior_weight

    if weights:
        fp32 = load_model(weights, dtype=torch.float32, for_inference=False)
        label = weights
    else:  # the cpu preset's cost does not depend on training: random weights time the same
        torch.manual_seed(0)
        fp32 = ImageTransformerSR(preset("cpu"))
        label = "cpu preset, random weights"
    if prior_weight is None:
        prior_weight = default_prior_weight(fp32)
    print(f"# bench-decode: {label}; {machine()}; input guidance (prior weight) {prior_weight:g}")
    print("\n## Cost of one model call vs tokens verified (batch 1, median of", reps, "calls)")
    calls = call_cost_table(fp32, max_k=max(ks), reps=reps)
    calls_md = print_table(calls, ["dtype", "tokens", "ms", "vs_1_token"])
    try:
        faces = load_faces(data).part("test")
        lr = downsample_8(faces.images[:n_images])
    except (FileNotFoundError, ValueError):
        lr = np.random.default_rng(0).integers(0, 256, (n_images, 8, 8, 3), dtype=np.uint8)
    model = _copy_for(fp32, getattr(torch, dtype))
    print(f"\n## Seconds per image, {dtype}, {len(lr)} held-out faces, batch {batch}")
    rows = []
    for i in range(0, len(lr), batch):
        rows.append(decode_table(model, lr[i : i + batch], ks, prior_weight=prior_weight))
    merged = []  # average over the batches
    for j, r in enumerate(rows[0]):
        m = dict(r)
        for key in ("s_per_image", "calls", "mean_block", "speedup", "ideal", "of_ideal"):
            if key in r:
                m[key] = float(np.mean([rr[j][key] for rr in rows]))
        merged.append(m)
    dec_md = print_table(merged, ["mode", "k", "s_per_image", "calls", "mean_block", "speedup", "of_ideal"])
    result = {"weights": label, "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "call_cost": calls, "decode": merged, "batch": batch, "images": int(len(lr)),
              "prior_weight": prior_weight, "dtype": dtype}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1))
        Path(out).with_suffix(".md").write_text(f"{calls_md}\n\n{dec_md}\n")
    return result


# ---------------------------------------------------------------- training throughput

def matmul_rate(dtype: torch.dtype, n: int = 2048, reps: int = 10) -> float:
    """Measured FLOP/s of a large square matmul: the ceiling training is compared against."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # warm-up
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def train_throughput(preset_name: str = "cpu", batch: int = 8, steps: int = 5, stage: str = "base",
                     head_frac: float = 0.1) -> dict:
    """Images/s of real training steps (bf16 autocast, the heads' loss on head_frac of the
    positions, deterministic algorithms on as in `train`) and the FLOPs they do, counted by
    torch's FlopCounterMode, as a fraction of the measured bf16 matmul rate. stage: "base" or
    "finetune" (the heads stage, which freezes the base, is not what this step does)."""
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
    peak = matmul_rate(torch.bfloat16)
    return {"preset": preset_name, "stage": stage, "head_frac": head_frac, "batch": batch,
            "seconds_per_step": sec, "images_per_s": batch / sec,
            "gflop_per_image": flops / batch / 1e9, "achieved_gflops": flops / sec / 1e9,
            "bf16_matmul_gflops": peak / 1e9, "fraction_of_matmul_rate": flops / sec / peak,
            "machine": machine()}
