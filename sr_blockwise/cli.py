"""The `sr-blockwise` command: one subcommand per job."""
from __future__ import annotations

import argparse
import sys


def cmd_train(a):
    from .train import TrainConfig, train
    cfg = TrainConfig(run=a.run, preset=a.preset, stage=a.stage, data=a.data, distill=a.distill,
                      init_from=a.init_from, batch_size=a.batch_size, lr=a.lr, warmup=a.warmup,
                      schedule_offset=a.schedule_offset,
                      head_loss=a.head_loss, head_frac=a.head_frac, head_weight=a.head_weight,
                      head_window=a.head_window,
                      max_steps=a.max_steps, max_minutes=a.max_minutes, ckpt_minutes=a.ckpt_minutes,
                      eval_minutes=a.eval_minutes, eval_images=a.eval_images, seed=a.seed, device=a.device, bf16=not a.fp32,
                      threads=a.threads)
    print(train(cfg, resume=a.resume, progress=not a.quiet))


# Each of these modules has `register(subparsers)` adding its subcommands (with set_defaults(func=...)).
SUBCOMMAND_MODULES = [
    "sr_blockwise.cli_core",  # prepare, weights, bench-decode, export, distill
    "sr_blockwise.cli_upscale",  # upscale
    "sr_blockwise.cli_evaluate",  # evaluate
    "apps.demo",  # demo
    "apps.rating",  # rate build / serve / analyze
]


def build_parser() -> argparse.ArgumentParser:
    import importlib
    import importlib.util

    p = argparse.ArgumentParser(prog="sr-blockwise", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).register(sub)

    t = sub.add_parser("train", help="train the base model / blockwise heads (resumable)")
    t.add_argument("--run", "--run-name", dest="run", default="cpu-base",
                   help="run name: checkpoints in ~/.cache/sr-blockwise/RUN (under torchrun spell it --run-name)")
    t.add_argument("--preset", default="cpu", choices=["tiny", "cpu", "gpu", "paper"])
    t.add_argument("--stage", default="base", choices=["base", "heads", "finetune"])
    t.add_argument("--data", default=None, help="prepared .npz, CelebA folder or photo folder")
    t.add_argument("--distill", default=None, help=".npz of greedy outputs to train on (finetune)")
    t.add_argument("--init-from", default=None, help="checkpoint or weights to start from")
    t.add_argument("--resume", action="store_true", help="continue the run's last checkpoint")
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=500)
    t.add_argument("--schedule-offset", type=int, default=0,
                   help="with --init-from: continue the source run's lr schedule from this step of it")
    t.add_argument("--head-loss", default="sum", choices=["sum", "random"])
    t.add_argument("--head-frac", type=float, default=0.25)
    t.add_argument("--head-weight", type=float, default=1.0)
    t.add_argument("--head-window", type=int, default=0,
                   help="W > 0: heads learn -log P(within W levels of the target), the eps=W rule's "
                        "acceptance, instead of cross-entropy")
    t.add_argument("--max-steps", type=int, default=10**9)
    t.add_argument("--max-minutes", type=float, default=1e9)
    t.add_argument("--ckpt-minutes", type=float, default=5.0)
    t.add_argument("--eval-minutes", type=float, default=10.0)
    t.add_argument("--eval-images", type=int, default=64,
                   help="validation faces scored for bits/dim; in the heads stage with --distill, "
                        "targets held out and scored for exact mode's mean block (val_block)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="cpu")
    t.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    t.add_argument("--threads", type=int, default=0)
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(func=cmd_train)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc = args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"sr-blockwise {args.command}: error: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
