"""`sr-blockwise evaluate`: speed and quality of blockwise decoding beside the paper's Table 2.
One option per field of evaluate.EvalConfig (plus --merge). Heavy imports (torch, the metrics)
happen only when the command runs."""
from __future__ import annotations

import argparse
import sys

from ..api import dtype_name
from . import config_from


# the run's records (EvalConfig.dtype, results.json, the decode store's keys) keep the short names
RECORDED_DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def dtype_option(value: str) -> str:
    """--dtype as every command spells it (bfloat16, ...); evaluate's former short names (bf16,
    ...) still work, with a note on stderr."""
    full = dtype_name(value)
    if full != value:
        print(f"sr-blockwise evaluate: --dtype {value} is deprecated: use --dtype {full}", file=sys.stderr)
    return full


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "evaluate", help="reproduce the paper's super-resolution tables: block size, speed, quality",
        description="Decode the held-out test faces with every weights x k x mode; measure mean accepted "
                    "block size, calls, seconds per image, speedup over greedy (with and without a KV "
                    "cache), PSNR / SSIM / perceptual distance against the real face and the exact output, "
                    "and bits/dim. Writes OUT/results.json, OUT/report.md, plots and image grids. "
                    "Exit code 1 if exact mode ever differs from greedy, or the exact-mode replay from decoding.")
    p.add_argument("--weights", nargs="+", default=["cpu-frozen", "cpu-finetuned"],
                   help="weights names or .json/.pt paths; append :frozen or :fine-tuned to say which "
                        "Table 2 column they match if the name does not")
    p.add_argument("--data", default=None, help="prepared .npz, CelebA folder or folder of faces "
                                               "(default: the project data; its held-out test split)")
    p.add_argument("-n", "--n-images", type=int, default=500, help="test faces to decode")
    p.add_argument("--limit", type=int, default=None, help="at most N faces (smoke tests)")
    p.add_argument("--first", type=int, default=0,
                   help="skip the first N test faces: a run in parts, e.g. --first 0 -n 256 and --first 256 "
                        "-n 244 in two sittings, then --merge")
    p.add_argument("--k", dest="ks", default="2,4,6,8,10", help="block sizes, comma separated")
    p.add_argument("--modes", default="exact,exact-heads,eps=2",
                   help="comma separated modes of the decode-mode grammar, without settings (k from --k): "
                        "greedy, exact, exact-heads (the heads' proposals alone: the paper's exact column), "
                        "eps=E, eps-window=E, top-k=N, min-block=N, oracle "
                        "(greedy, with and without KV cache, always runs first)")
    p.add_argument("--batch-size", type=int, default=1, help="images per decode call (the paper: 1)")
    p.add_argument("--dtype", default="bfloat16", type=dtype_option, choices=list(RECORDED_DTYPES),
                   help="precision of the decoding's matrix products (bits/dim is always float32)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: torch's default; use 1 when another job shares the cores)")
    p.add_argument("--perceptual", default="auto", choices=["auto", "lpips", "stlpips", "stlpips-vgg", "none"],
                   help="auto: LPIPS if its AlexNet weights are on disk, else ST-LPIPS")
    p.add_argument("--uncached-prefix", type=int, default=64,
                   help="tokens of the no-cache greedy decoder to run for real (the rest is estimated)")
    p.add_argument("--decode-exact", type=int, default=None, metavar="N",
                   help="exact modes: decode only the first N faces for real (seconds, identity to greedy, "
                        "quality); exact-heads rows take every face's block sizes from the replay, one "
                        "teacher-forced pass over the greedy output that gives the heads' blocks for all k at "
                        "once (checked against the N real decodes), exact rows cover the N faces (their "
                        "recycled proposals cannot be replayed); default: decode every face")
    p.add_argument("--decode-approx", type=int, default=None, metavar="N",
                   help="modes that are not exact (eps, top-k, min-block, oracle): decode only the first N "
                        "faces (their rows then cover N faces; default: every face)")
    p.add_argument("--grid-images", type=int, default=6, help="faces in the image grid")
    p.add_argument("--json", dest="json_path", default=None, help="JSON path (default OUT/results.json)")
    p.add_argument("--out", default="results", help="output folder")
    p.add_argument("--cache-dir", default="~/.cache/sr-blockwise/evaluate",
                   help="every finished decode batch is saved here ('none': nowhere)")
    p.add_argument("--resume", action="store_true",
                   help="read back the batches a stopped run with the same settings already decoded "
                        "(found in --cache-dir) instead of decoding them again; the report says how many "
                        "batches came from earlier sittings")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="decode nothing: merge finished runs' results.json files (same settings; different "
                        "weights, or the same weights over adjacent --first ranges) into one report, plots and "
                        "JSON under --out")
    p.add_argument("--prior-weight", type=float, default=1.0, metavar="W",
                   help="input guidance of every decode; 1: the model as trained, as the paper's Table 2 "
                        "measures it (the demo, upscale and the API decode at the weights' default, 2 for the "
                        "shipped ones: pass --prior-weight 2 to measure what they give; see `upscale "
                        "--prior-weight`); bits/dim stay the model's as trained")
    # the default from the parser, not the option: its help would print "(default: True)" beside
    # --quiet, which reads as quiet (set first: set_defaults also rewrites an option's default)
    p.set_defaults(func=run, progress=True)
    p.add_argument("--quiet", dest="progress", action="store_false", default=argparse.SUPPRESS,
                   help="no progress bar")


def run(a) -> int:
    from ..evaluate import evaluate

    if a.merge:
        from ..evaluate import merge
        command = " ".join(["sr-blockwise", "evaluate", "--merge", *map(str, a.merge), "--out", str(a.out)]
                           + (["--json", str(a.json_path)] if a.json_path else []))
        result = merge(a.merge, a.out, json_path=a.json_path, command=command)
        return _report(result)
    if a.limit is not None and a.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {a.limit}")
    if a.resume and a.cache_dir.lower() == "none":
        raise ValueError("--resume reads the batches saved in --cache-dir: give one, not 'none'")
    if a.n_images < 1:
        raise ValueError(f"--n-images must be >= 1, got {a.n_images}")
    if a.first < 0:
        raise ValueError(f"--first must be >= 0, got {a.first}")
    return _report(evaluate(config_of(a)))


def config_of(a):
    """The run's EvalConfig: every field from the option of its name, the lists and the store
    folder read from their text, the dtype in the records' short name."""
    from ..evaluate import EvalConfig, parse_list
    return config_from(EvalConfig, a, ks=parse_list(a.ks, int), modes=parse_list(a.modes),
                       dtype=RECORDED_DTYPES[a.dtype],
                       cache_dir=None if a.cache_dir.lower() == "none" else a.cache_dir)


def _report(result) -> int:
    """Print where the files went and the headline; exit code 1 if exact mode was not exact."""
    files = result["files"]
    print(f"wrote {files['json']}, {files['report']}")
    sm = result["summary"]
    pk = sm["peak_speedup_vs_greedy"]
    if pk:
        print(f"peak speedup over KV-cached greedy: {pk['speedup']:.2f}x ({pk['weights']}, {pk['mode']}, k={pk['k']})")
    if not sm["replay_all_match"]:
        print("the exact-mode replay differs from the real decodes: its block sizes are not to be trusted",
              file=sys.stderr)
        return 1
    if not sm["exact_all_identical"]:
        bad = [r for r in sm["exact_identical_to_greedy"] if r["identical_to_greedy"] < 1]
        for r in bad:
            print(f"exact mode differs from greedy: {r['weights']} k={r['k']}: identical on "
                  f"{100 * r['identical_to_greedy']:.1f}% of images", file=sys.stderr)
        return 1
    return 0
