"""`sr-blockwise upscale INPUT... -o OUTDIR`: the batch command (docs/upscale.md)."""
from __future__ import annotations

import argparse
from dataclasses import fields

from ..api import DEFAULT_DTYPE, DTYPES, dtype_name
from ..batch.files import SAVE_ARGS
from ..batch.plan import FACES, NO_FACE, Config
from ..batch.run import run


def decode_mode(name: str) -> str:
    """--mode: one of sr_blockwise.decoding.MODES. Checked here rather than with `choices=`, which
    would import the decoder (and torch) whenever the parser is built, e.g. for `sr-blockwise --help`."""
    from ..decoding import MODES
    if name not in MODES:
        raise argparse.ArgumentTypeError(f"invalid choice: {name!r} (choose from {', '.join(MODES)})")
    return name


def cmd_upscale(args: argparse.Namespace) -> int:
    cfg = Config(**{f.name: getattr(args, f.name) for f in fields(Config)})
    return run(cfg)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "upscale", help="upscale files / folders / globs of faces to 32x32 (batched, resumable)",
        description="Faces in, 32x32 results out. Folders are searched recursively and mirrored in "
                    "OUTDIR. Exit code: 0 all succeeded, 1 some inputs failed, 2 bad arguments, "
                    "130 stopped by Ctrl-C.")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="image files, folders or glob patterns "
                   "(quote globs: 'photos/**/*.jpg')")
    p.add_argument("-o", "--outdir", required=True, metavar="OUTDIR")
    p.add_argument("--mode", default="exact", type=decode_mode, metavar="MODE",
                   help="greedy: one token per call; exact: blockwise, same output as greedy (default); "
                        "approx: blockwise, accepts proposals within --eps levels; sample: temperature sampling "
                        "(with --k > 1 by speculative sampling: the same distribution, fewer calls)")
    p.add_argument("--k", type=int, default=Config.k,
                   help="block size for exact / approx / sample (default: the fastest setting measured on the "
                        "native engine, 2 for exact, 4 for approx and sample; sample --k 1: plain sampling)")
    p.add_argument("--eps", type=int, default=None, help="approx mode only: tolerance in intensity levels (default 2)")
    p.add_argument("--temperature", type=float, default=None, help="sample mode only: above 0 (default 1.0)")
    p.add_argument("--seed", type=int, default=None,
                   help="sample mode only (default 0): the same seed and --k give the same images")
    p.add_argument("--weights", default=None, help="weights name or .json path (default: the shipped default)")
    p.add_argument("--batch-size", type=int, default=16, help="images decoded together (default 16)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default=DEFAULT_DTYPE, type=dtype_name, choices=DTYPES,
                   help="bf16, fp16 and fp32 are taken too")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: torch's default)")
    p.add_argument("--ext", default="png", choices=sorted(SAVE_ARGS), help="output format (default png)")
    p.add_argument("--suffix", default="", help="added to each output's name: face.jpg -> face{SUFFIX}.png "
                                                   "(face{SUFFIX}_compare.png, face{SUFFIX}_pasted.png)")
    p.add_argument("--skip-existing", action="store_true", help="leave outputs that exist (resume a run)")
    p.add_argument("--compare", action="store_true",
                   help="also write NAME_compare.EXT: 8x8 input, bicubic, output (, ground truth)")
    p.add_argument("--metrics", default=None, metavar="FILE.csv|FILE.json", help="per-image statistics")
    p.add_argument("--ground-truth", default=None, metavar="DIR",
                   help="real faces, matched by relative path and stem: adds PSNR / SSIM to --metrics")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="process only shard I of N (0-based); 'auto' takes RANK/WORLD_SIZE from torchrun")
    p.add_argument("--measure-greedy", action="store_true",
                   help="decode the first batch greedily too and report the wall-clock speedup")
    p.add_argument("--match-input", action=argparse.BooleanOptionalAction, default=True,
                   help="shift each output's 4x4 blocks, per channel, so that their means are the 8x8 "
                        "input's again (back-projection; default on: it fixes colour drift and collapsed "
                        "patches; at the default guidance, ST-LPIPS -0.015 and PSNR +0.24 dB on 96 held-out "
                        "faces, PSNR better on every one). "
                        "--no-match-input saves the decoder's own output")
    p.add_argument("--prior-weight", type=float, default=None, metavar="W",
                   help="input guidance: the weight of the model's learned prior toward the 8x8 input's "
                        "own intensities (1: the model as trained; default: 2, sr_blockwise.decoding."
                        "DEFAULT_PRIOR_WEIGHT, where the model has that prior, else 1; see the README; large "
                        "values give a blocky upscale)")
    p.add_argument("--guard", type=float, default=None, metavar="LEVELS",
                   help="the cell guard: pull each 4x4 cell of the output back while it is decoded once "
                        "its mean would end up more than LEVELS intensity levels off its 8x8 input pixel, "
                        "as in greedy decoding's collapses into a flat wrong colour and rarely in real faces "
                        "(default: 32, sr_blockwise.decoding.DEFAULT_GUARD, in greedy, exact and approx "
                        "mode; none in sample mode; 0: off, the model as trained)")
    p.add_argument("--faces", default="largest", choices=FACES,
                   help="largest: the largest face found in each photo, aligned to the framing the model was "
                        "trained on (default; the search stops at it, smaller faces are not looked for); "
                        "all: every face, written NAME_face0, NAME_face1, ... (largest "
                        "first); none: no detection, the centre square (CelebA's crop for 178x218 photos). "
                        "8x8 and 32x32 images are always used as they are")
    p.add_argument("--no-face", default="centre", choices=NO_FACE,
                   help="a photo where no face is found: centre (its centre square, with a warning) "
                        "or skip (no output, listed in the summary)")
    p.add_argument("--paste-back", action="store_true",
                   help="also write NAME_pasted.EXT: each face replaced by its result (warped back, blended in "
                        "with a feathered mask) at the scale the model works at: where a face is larger than "
                        "the 32x32 output, the photo reduced so that its largest face is 8 px, then enlarged "
                        "4x; faces of at most 32 px, the photo 4x (at most 64 MP). The summary gives each "
                        "photo's scale")
    p.add_argument("--dry-run", action="store_true", help="list what would be done (todo/skip, input, output) after the argument "
                                                         "checks that need no model (not --device: the machine's); "
                                                         "with --paste-back also the scale each photo would be pasted "
                                                         "back at (its faces are found)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary; failures still go to stderr")
    p.set_defaults(func=cmd_upscale)
