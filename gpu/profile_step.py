"""Where a training step's time goes, to choose a GPU training run's settings (gpu/README.md).

At 950-1,015 images/s the cpu preset used ~7% of an H200's bf16 rate (experiments/gpu-finetuning/), and a
larger batch did not help the gpu preset (289 images/s at 128, 282 at 64): something other than
the matrix products sets the pace. This measures it, in about a minute:
  1. images/s of the real training step (train.train_step, fine-tuning: base and heads) at each
     batch size, and the peak memory; on CUDA also with the GPU's queue drained every step, so
     that the gap between the two says how much the CPU's queueing costs;
  2. a torch.profiler table of a few steps at the first batch size: the operators that take the
     most device time (CUDA) or CPU time, and how busy the device was.

    python3 gpu/profile_step.py --preset cpu --batches 128,256,512 --device cuda

Random tokens: a step's cost does not depend on the pixels. It runs on a CPU too (the test).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sr_blockwise.model import SEQ_LEN, VOCAB, ImageTransformerSR, preset  # noqa: E402
from sr_blockwise.train import TrainConfig, TrainingLoss, make_optimizer, train_step  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def images_per_s(loss_fn, opt, clip_parts, cfg: TrainConfig, batch: int, steps: int, drain: bool) -> float:
    src = torch.randint(VOCAB, (batch, 192), device=cfg.device)
    tgt = torch.randint(VOCAB, (batch, SEQ_LEN), device=cfg.device)
    for s in range(2):  # warm-up: allocator, kernels' first calls
        train_step(loss_fn, opt, clip_parts, src, tgt, torch.Generator().manual_seed(s), s, cfg)
    sync(cfg.device)
    t = time.perf_counter()
    for s in range(steps):
        train_step(loss_fn, opt, clip_parts, src, tgt, torch.Generator().manual_seed(s), s, cfg)
        if drain:
            sync(cfg.device)
    sync(cfg.device)
    return batch * steps / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--batches", default="128,256", help="comma-separated batch sizes")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per batch size")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=15, help="operators per profiler table")
    ap.add_argument("--fp32", action="store_true", help="float32 steps, not bf16 autocast (as train --fp32)")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    cuda = a.device.startswith("cuda")
    cfg = TrainConfig(preset=a.preset, stage="finetune", head_frac=0.25, head_weight=0.5, device=a.device,
                      lr=1e-4, warmup=10, bf16=not a.fp32)
    torch.manual_seed(0)
    model = ImageTransformerSR(preset(a.preset)).to(a.device).train()
    loss_fn = TrainingLoss(model, cfg)
    opt, clip_parts = make_optimizer(model, cfg)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"== {a.preset} preset ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters), "
          f"fine-tuning step, {'float32' if a.fp32 else 'bf16 autocast'}, {name}, torch {torch.__version__}")
    print("| batch | images/s | images/s, drained every step | peak memory (GB) |\n|---|---|---|---|")
    rate = {}
    for b in batches:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            rate[b] = images_per_s(loss_fn, opt, clip_parts, cfg, b, a.steps, drain=False)
            drained = images_per_s(loss_fn, opt, clip_parts, cfg, b, a.steps, drain=True) if cuda else float("nan")
        except torch.OutOfMemoryError:
            print(f"| {b} | out of memory | | |")
            break
        mem = torch.cuda.max_memory_allocated() / 1e9 if cuda else float("nan")
        print(f"| {b} | {rate[b]:.0f} | {drained:.0f} | {mem:.1f} |", flush=True)
    if not rate:
        return

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, schedule
    b = next(iter(rate))  # the first batch size that fit
    src = torch.randint(VOCAB, (b, 192), device=a.device)
    tgt = torch.randint(VOCAB, (b, SEQ_LEN), device=a.device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # the first step is a warm-up the tables leave out; a step's own time is the unprofiled one
    with profile(activities=acts, schedule=schedule(wait=0, warmup=1, active=a.profile_steps, repeat=1)) as prof:
        for s in range(1 + a.profile_steps):
            train_step(loss_fn, opt, clip_parts, src, tgt, torch.Generator().manual_seed(s), s, cfg)
            sync(a.device)
            prof.step()
    ev = prof.key_averages()
    step_ms = b / rate[b] * 1e3
    print(f"\n== profiler, batch {b}, {a.profile_steps} steps; an unprofiled step takes {step_ms:.1f} ms")
    if cuda:
        # a kernel's time is on its own row and again on the operator that launched it: count kernels only
        kernels = [e for e in ev if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
        busy_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / a.profile_steps
        print(f"device busy {busy_ms:.1f} ms a step, {busy_ms / step_ms:.0%} of an unprofiled step; "
              f"kernels a step: {sum(e.count for e in kernels) // a.profile_steps}")
        print(ev.table(sort_by="self_device_time_total", row_limit=a.rows))
    print(ev.table(sort_by="self_cpu_time_total", row_limit=a.rows))

if __name__ == "__main__":
    main()
