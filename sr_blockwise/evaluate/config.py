"""What an evaluation run measures: the modes (`exact`, `eps=2`, ...), the weights given on the
command line, and EvalConfig, the run's settings."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..api import dtype_name
from ..decoding import DecodeOptions
from ..model import SEQ_LEN


@dataclass(frozen=True)
class Mode:
    """A decode mode that --k and --prior-weight fill in: the grammar's MODE[:tree=N], canonical
    (parse_mode), e.g. exact, eps-window=2, top-k=3, exact:tree=64. Its options come from the
    grammar itself (decoding.DecodeOptions.parse)."""
    name: str

    def options(self, k: int, prior_weight: float = 1.0) -> DecodeOptions:
        return DecodeOptions.parse(self.name, k=k, prior_weight=prior_weight)

    @property
    def settings(self) -> DecodeOptions:
        """The mode's rule, eps, top_k, min_block and tree, at a stand-in block size."""
        return DecodeOptions.parse(self.name, k=16)


def parse_mode(text: str) -> Mode:
    """A MODE of the project's decode-mode grammar (decoding.DecodeOptions.parse) without settings,
    which --k and --prior-weight fill in: greedy | exact | exact-heads (the heads' proposals alone,
    the paper's) | oracle | eps=E | eps-window=E (the eps rule with window-centre proposals) |
    top-k=N | min-block=N (the exact rule); :tree=N verifies N candidates a call as a tree."""
    head, colon, rest = str(text).strip().partition(":")
    if colon and not all(x.strip().lower().startswith("tree=") for x in rest.split(":")):
        raise ValueError(f"mode {text!r}: give the mode alone ({head}), or with :tree=N; k comes from --k and "
                         f"the input guidance from --prior-weight")
    if head.strip().lower() == "sample":
        raise ValueError(f"mode {text!r}: evaluate measures greedy and blockwise decoding, not sampling")
    try:
        o = DecodeOptions.parse(text.strip(), k=16)  # a stand-in k: the modes are crossed with --k
    except ValueError as e:
        if str(e).startswith("unknown decode mode"):
            raise ValueError(f"unknown mode {text!r}: use greedy, exact, exact-heads, oracle, eps=E, eps-window=E, "
                             f"top-k=N or min-block=N") from None
        raise ValueError(f"mode {text!r}: {e}") from None
    return Mode(o.mode + (f":tree={o.tree}" if o.tree else ""))


def parse_list(text, kind=str) -> list:
    """'2,4,6' or ['2,4', '6'] -> [2, 4, 6]."""
    parts = [text] if isinstance(text, str) else list(text)
    out = [p.strip() for s in parts for p in str(s).split(",") if p.strip()]
    try:
        return [kind(p) for p in out]
    except ValueError:
        raise ValueError(f"could not read {text!r} as a comma-separated list") from None


def weights_spec(spec: str) -> tuple[str, str | None]:
    """NAME_OR_PATH[:frozen|:fine-tuned] -> (name_or_path, variant or None)."""
    head, sep, tail = spec.rpartition(":")
    if sep and tail.lower().replace("_", "-") in ("frozen", "fine-tuned", "finetuned"):
        return head, "frozen" if tail.lower() == "frozen" else "fine-tuned"
    return spec, None


def weights_name(path: Path) -> str:
    """What a weights file is called in the report: shipped weights by their name, a training
    checkpoint by its run folder too (every run's checkpoint is called last.pt)."""
    return f"{path.parent.name}/{path.stem}" if path.suffix == ".pt" else path.stem


def infer_variant(name: str, meta: dict) -> str | None:
    """Which column of Table 2 weights belong to: from the name, else the card's training stage."""
    n = name.lower().replace("_", "-")
    if "finetun" in n or "fine-tun" in n:
        return "fine-tuned"
    if "frozen" in n:
        return "frozen"
    stage = str(meta.get("stage", "")).lower()
    return {"finetune": "fine-tuned", "heads": "frozen", "base": "frozen"}.get(stage)


@dataclass
class EvalConfig:
    weights: list[str] = field(default_factory=lambda: ["cpu-frozen", "cpu-finetuned"])
    data: str | None = None  # default: the project's data (SR_BLOCKWISE_DATA), held-out test split
    n_images: int = 500
    limit: int | None = None  # smoke tests: at most this many images
    first: int = 0  # skip this many test faces: a run in parts (merged with --merge)
    ks: list[int] = field(default_factory=lambda: [2, 4, 6, 8, 10])
    modes: list[str] = field(default_factory=lambda: ["exact", "exact-heads", "eps=2"])
    batch_size: int = 1  # the paper's Figure 4 is at batch 1
    dtype: str = "bf16"
    device: str = "cpu"
    threads: int = 0  # 0: torch's default
    out: str = "results"
    json_path: str | None = None  # default OUT/results.json
    perceptual: str = "auto"  # auto | lpips | stlpips | stlpips-vgg | none
    uncached_prefix: int = 64  # tokens of the real no-cache decoder to run (see time_uncached_greedy)
    # exact modes: decode only the first N images for real (timing, identity, quality); the block
    # statistics of exact-heads rows cover all images, from the replay (decoding.exact_block_stats),
    # exact rows' (recycled proposals: no replay) the N. None: decode all
    decode_exact: int | None = None
    # other modes (eps, top-k, ...): decode only the first N images (they cannot be replayed)
    decode_approx: int | None = None
    grid_images: int = 6
    progress: bool = True
    # finished decode batches are saved here (None: nowhere); with resume=True, batches already
    # there are read back instead of decoded again, so a stopped run goes on where it was
    cache_dir: str | None = None
    resume: bool = False
    # input guidance of every decode (decoding.DecodeOptions.prior_weight); 1: the model as trained.
    # bits/dim are always the model's as trained
    prior_weight: float = 1.0

    def command(self) -> str:
        """The command line that reproduces this run."""
        a = ["sr-blockwise", "evaluate", "--weights", *self.weights]
        if self.data:
            a += ["--data", str(self.data)]
        if self.first:
            a += ["--first", str(self.first)]
        a += ["--n-images", str(self.n_images)]
        if self.limit is not None:
            a += ["--limit", str(self.limit)]
        a += ["--k", ",".join(map(str, self.ks)), "--modes", ",".join(self.modes),
              "--batch-size", str(self.batch_size), "--dtype", dtype_name(self.dtype), "--device", self.device]
        if self.threads:
            a += ["--threads", str(self.threads)]
        if self.decode_exact is not None:
            a += ["--decode-exact", str(self.decode_exact)]
        if self.decode_approx is not None:
            a += ["--decode-approx", str(self.decode_approx)]
        a += ["--uncached-prefix", str(self.uncached_prefix)]
        a += ["--perceptual", self.perceptual, "--out", str(self.out)]
        a += ["--cache-dir", str(self.cache_dir) if self.cache_dir else "none"]
        if self.resume:
            a += ["--resume"]
        if self.json_path:
            a += ["--json", str(self.json_path)]
        if self.prior_weight != 1:
            a += ["--prior-weight", f"{self.prior_weight:g}"]
        return shlex.join(a)


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
