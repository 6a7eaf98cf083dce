"""`sr-blockwise train`: train the base model or the blockwise heads (resumable). One option per
field of train.TrainConfig."""
from __future__ import annotations

from . import config_from


def cmd_train(a):
    from ..train import TrainConfig, train
    print(train(config_from(TrainConfig, a), resume=a.resume, progress=not a.quiet))


def register(sub) -> None:
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
    t.add_argument("--weight-decay", type=float, default=0.0)
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
    t.add_argument("--fp32", dest="bf16", action="store_false", help="no bf16 autocast")
    t.add_argument("--threads", type=int, default=0)
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(func=cmd_train)
