"""`sr-blockwise learning-curve`: bits/dim against images seen, from training runs' logs."""
from __future__ import annotations


def cmd_learning_curve(a):
    """Train and held-out bits/dim against images seen, from the runs' log.csv files."""
    import csv

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..train import CACHE_DIR

    logs = [(run, batch, list(csv.DictReader(open(CACHE_DIR / run / "log.csv"))))
            for run, batch in zip(a.runs, a.batch_sizes or [8] * len(a.runs))]
    # heads-stage distillation runs log val_block (their base, so its bits/dim, cannot move)
    with_blocks = any(r.get("val_block") for _, _, rows in logs for r in rows)
    fig, axes = plt.subplots(1, 2 if with_blocks else 1, figsize=(13 if with_blocks else 9, 4), squeeze=False)
    ax = axes[0, 0]
    offset = 0
    for run, batch, rows in logs:
        steps = [int(r["step"]) * batch + offset for r in rows]
        train_bpd = [(s, float(r["bpd_train"])) for s, r in zip(steps, rows) if r["bpd_train"]]
        if train_bpd:
            ax.plot(*zip(*train_bpd), alpha=0.4, label=f"{run}: train batch")
        val = [(s, float(r["val_bpd"])) for s, r in zip(steps, rows) if r["val_bpd"]]
        if val:
            ax.plot(*zip(*val), "o-", label=f"{run}: validation")
        blocks = [(s, float(r["val_block"])) for s, r in zip(steps, rows) if r.get("val_block")]
        if blocks:
            axes[0, 1].plot(*zip(*blocks), "o-", label=run)
        offset = steps[-1]
    if with_blocks:
        axes[0, 1].set_xlabel("training images seen")
        axes[0, 1].set_ylabel("held-out exact block, k = n_blockwise")
        axes[0, 1].grid(alpha=0.3)
        axes[0, 1].legend(fontsize=8)
    ax.set_xlabel("training images seen")
    ax.set_ylabel("bits/dim (p1)")
    ax.set_ylim(top=8.2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: never over a curve
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")
    return 0


def register(sub):
    p = sub.add_parser("learning-curve", help="plot bits/dim from training runs' logs")
    p.add_argument("runs", nargs="+", help="run names in ~/.cache/sr-blockwise, in training order")
    p.add_argument("--batch-sizes", type=int, nargs="*", default=None)
    p.add_argument("-o", "--out", default="docs/learning-curve.png")
    p.set_defaults(func=cmd_learning_curve)
