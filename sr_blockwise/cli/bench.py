"""`sr-blockwise bench-decode` and `bench-train`: decoding and training speed (sr_blockwise/bench.py)."""
from __future__ import annotations

from ..api import dtype_name


def cmd_bench(a):
    import torch

    from ..bench import run

    if a.threads < 0:
        raise ValueError(f"--threads must be 0 (torch's default) or more, got {a.threads}")
    if a.threads:
        torch.set_num_threads(a.threads)
    ks = [int(k) for k in a.k.split(",")]
    batches = [int(b) for b in a.batch_size.split(",")]
    trees = [int(n) for n in a.trees.split(",")] if a.trees else []
    run(a.weights, a.images, batches[0], a.reps, a.json, ks, a.data, a.prior_weight, a.dtype, batches,
        a.torch_images, trees)
    return 0


def cmd_bench_train(a):
    from ..bench import train_throughput

    r = train_throughput(a.preset, a.batch_size, a.steps, a.stage, a.head_frac)
    for k, v in r.items():
        print(f"{k:>26}: {v:.3f}" if isinstance(v, float) else f"{k:>26}: {v}")
    return 0


def register(sub):
    p = sub.add_parser("bench-decode", help="cost per call vs tokens verified; seconds per face; images/s",
                       description="The speed tables of the README and docs/engine.md: what one model call "
                                   "costs against the tokens it verifies, where a call's time goes, seconds "
                                   "per face and images/s for greedy, exact, approximate and oracle decoding "
                                   "at each batch size, with the machine's matrix-product rates beside them.")
    p.add_argument("--weights", default=None, help="default: the cpu preset with random weights")
    p.add_argument("--images", type=int, default=4, help="faces per batch size (at least one batch)")
    p.add_argument("--batch-size", default="1,16,64", help="batch sizes, comma-separated")
    p.add_argument("--reps", type=int, default=50, help="calls timed per call-cost cell (divided by the batch size)")
    p.add_argument("--k", default="2,6,10", help="block sizes, comma-separated: each is decoded, and its call "
                                                 "broken down by stage")
    p.add_argument("--torch-images", type=int, default=1,
                   help="faces the torch engine decodes at batch 1 for comparison (0: skip; ~10 s each per mode)")
    p.add_argument("--trees", default="", help="tree sizes (e.g. 64,256): exact and eps=2 trees at the largest "
                                               "--k on the torch engine's faces (--torch-images)")
    p.add_argument("--data", default=None, help="faces to decode (default: the held-out CelebA faces, or random inputs where there are none)")
    p.add_argument("--json", default="results/bench_decode.json", help="results as JSON, and the tables beside it as .md")
    p.add_argument("--prior-weight", type=float, default=None,
                   help="input guidance for every decode (default: the apps' default, 2, where the model "
                        "has the input prior; else 1)")
    p.add_argument("--dtype", default="float32", type=dtype_name, choices=["bfloat16", "float32"],
                   help="dtype of the weights (the native engine computes in float32 either way)")
    p.add_argument("--threads", type=int, default=0,
                   help="threads decoding runs on (0: torch's default, one per core)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("bench-train", help="training images/s and the fraction of the matmul rate (bf16 or float32, the faster)")
    p.add_argument("--preset", default="cpu")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    # (not the heads stage: it freezes the base, which this bench's step does not)
    p.add_argument("--stage", choices=["base", "finetune"], default="base")
    p.add_argument("--head-frac", type=float, default=0.1, help="positions the heads' loss is taken at")
    p.set_defaults(func=cmd_bench_train)
