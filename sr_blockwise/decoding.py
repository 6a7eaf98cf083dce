"""Greedy, blockwise parallel and sampled decoding of a batch of 8x8 inputs, KV cached.

Blockwise (Stern et al. 2018), merged predict+verify: from the confirmed prefix of t tokens we
hold k proposals y_t..y_{t+k-1} (the first is p1's own argmax, so it is certain). One model call
feeds all k at positions t+1..t+k; p1's argmax at each position verifies the next proposal; the
longest accepted prefix is kept, and the heads read at the last accepted position give the next
block's proposals. About 3072/k + 1 calls instead of 3072. k=1 is plain greedy decoding.

Sampling (temperature > 0) with k > 1 is speculative sampling (Leviathan et al. 2023, Chen et al.
2023) on the same merged loop: the first token is p1's sample, the heads sample their drafts, and
a draft is kept with probability min(1, p(x)/q(x)); at the first rejection the token is drawn
from max(0, p - q) instead, and becomes the next block's first token. The samples then have
exactly the distribution of plain sampling (one token per call), in fewer calls.

Each image keeps its own position and accepted length: finished images leave the batch, and
every call has the same shape (k tokens per image), so an image's output does not depend on the
batch it was decoded in.

`decode` on the torch engine is a short loop over named stages: `_start` (encode, the first
call, the first proposals), then per call `_verify` (feed the proposals, apply the acceptance
rule: one function per rule, `ACCEPT`, or speculative sampling's), `_commit` (write the accepted
tokens) and `_propose` (the next block from the last accepted state). The native engine
(engine.cpp) runs the same stages inside one call per step.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .data import check_input, from_tokens, to_tokens
from . import engine as native
from .model import SEQ_LEN, ImageTransformerSR

RULES = ("exact", "eps", "topk", "oracle")
PROPOSALS = ("argmax", "window", "recycle")

# One grammar for decode modes, read by the upscale options, evaluate, bench-decode and the rating
# tool:   MODE[:k=K][:min-block=N][:w=G][:guard=L][:T=T][:seed=S]
# MODE is greedy (k=1), exact (recycled proposals), exact-heads (the paper's: the heads' alone),
# oracle, eps=E, eps-window=E, top-k=N, min-block=N (the exact rule, at least N tokens a call) or
# sample (temperature T > 0; k > 1 is speculative sampling). k: block
# size; min-block=N after eps / top-k / oracle; w: input guidance (prior_weight, default 1); guard:
# the cell guard's tolerance in levels (default 0, off); T and seed: sampling only. Settings come
# in any order; every mode but greedy needs k (a caller may fill it in:
# DecodeOptions.parse(spec, k=6)). DecodeOptions.spec writes the one canonical form:
# DecodeOptions.parse(o.spec) == o.
SPEC_MODES = ("greedy", "exact", "exact-heads", "oracle", "sample", "eps=E", "eps-window=E", "top-k=N",
              "min-block=N")
SPEC_HELP = ("MODE[:k=K][:min-block=N][:w=G][:guard=L][:T=T][:seed=S] with MODE one of " + ", ".join(SPEC_MODES)
             + " (e.g. exact:k=6, eps=2:k=6:w=2, sample:k=4:T=0.8)")
_MODE_ALIASES = {"topk": "top-k", "minblock": "min-block", "epswindow": "eps-window", "exactheads": "exact-heads"}
_KEYS = {"k": "k", "w": "w", "guard": "guard", "t": "T", "seed": "seed", "min-block": "min-block",
         "minblock": "min-block"}
_INT = re.compile(r"[+-]?\d+")


def _spec_number(x: float) -> str:
    """The shortest text that reads back as exactly x: 2.0 -> '2', 0.8 -> '0.8'."""
    s = f"{x:g}"
    return s if float(s) == x else repr(float(x))


def check_seed(seed) -> None:
    """ValueError unless a sampling seed is a whole number in 0..2^32-1: torch's generators take
    64 bits, and a seed is multiplied by a per-image stride before it reaches one."""
    whole = isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)
    if not (whole and 0 <= seed < 2**32):
        raise ValueError(f"seed must be a whole number in 0..{2**32 - 1}, got {seed!r}")


@dataclass
class DecodeOptions:
    """How to decode. propose's default depends on the other fields, and is settled when the
    options are made: derive options by making new ones (DecodeOptions(...), parse, options_for),
    not with dataclasses.replace, which would carry the first ones' choice over."""
    k: int = 1  # block size: tokens proposed per call (1 = greedy)
    rule: str = "exact"  # exact | eps | topk | oracle (accept everything: the speed upper bound)
    eps: int = 0  # eps rule: accept a proposal within eps intensity levels of p1's argmax
    top_k: int = 1  # topk rule: accept a proposal among p1's top_k values
    min_block: int = 1  # accept at least this many tokens per call, whatever the rule says
    # > 0: sample at this temperature; with k > 1 by speculative sampling (the heads' sampled
    # drafts accepted with probability min(1, p/q), a rejected one resampled from max(0, p - q)):
    # the output has the distribution of plain one-token-per-call sampling. 0: greedy / blockwise
    temperature: float = 0.0
    seed: int = 0
    # where proposals 2..k come from: "argmax", the heads' argmax (the paper; the grammar's
    # exact-heads); for the eps rule "window", the centre of the most probable (2*eps+1)-wide
    # window of the head's distribution, the value most likely to land within eps of p1's argmax;
    # for the exact rule "recycle" (the grammar's exact): the heads' argmax, except at the
    # positions the last call verified past its rejected proposal, where p1's own argmax from
    # that call (those logits read the rejected token, yet exact mode's blocks grow 1.5 -> 2.1 at
    # k=6, output unchanged; under the eps rule such proposals were accepted less often than the
    # heads': experiments/recycled-proposals/). None: "recycle" where it applies (the exact rule,
    # k > 1, min_block 1, no sampling), else "argmax"
    propose: str | None = None
    # input guidance: the weight of the model's learned prior over (intensity - the 8x8 input's
    # intensity of that cell and channel), in p1 and in every head. 1 is the model as trained;
    # above 1 pulls every prediction toward the input (measured: 2 is closer to the real faces
    # than 1 and lengthens blocks; large weights give the blocky nearest-neighbour upscale).
    # Exact mode equals greedy decoding at the same weight.
    prior_weight: float = 1.0
    # the cell guard (cell_guard): > 0 pulls a 4x4 cell back while it is decoded once its mean
    # would end up more than this many levels off the cell's 8x8 input pixel, as in greedy
    # decoding's collapses and rarely in real faces (experiments/cell-guard/); 0: off, the model
    # as trained. It acts on p1 (the heads propose unguarded): exact mode equals greedy decoding
    # with the same guard.
    guard: float = 0.0

    def __post_init__(self):
        if self.propose is None:
            recycles = self.rule == "exact" and self.k > 1 and self.min_block == 1 and self.temperature == 0
            self.propose = "recycle" if recycles else "argmax"

    def validate(self) -> None:
        """Raise ValueError naming what is wrong with these options on any model (check() adds
        the model's limits). A setting that would change nothing is refused too, so that every
        valid DecodeOptions has exactly one spec."""
        if self.k < 1:
            raise ValueError(f"k={self.k}: the block size must be >= 1")
        if self.rule not in RULES:
            raise ValueError(f"unknown acceptance rule {self.rule!r}; choose from {RULES}")
        if self.propose not in PROPOSALS:
            raise ValueError(f"unknown proposal {self.propose!r}; choose from {PROPOSALS}")
        if not 0 <= self.eps <= 255:
            raise ValueError(f"eps must be in 0..255 intensity levels, got {self.eps}")
        if self.eps != 0 and self.rule != "eps":
            raise ValueError(f"eps={self.eps} is the eps rule's tolerance; the {self.rule} rule would ignore it")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_k != 1 and self.rule != "topk":
            raise ValueError(f"top_k={self.top_k} is the topk rule's setting; the {self.rule} rule would ignore it")
        if not 1 <= self.min_block <= self.k:
            raise ValueError(f"min_block must be in 1..k={self.k}, got {self.min_block}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature}")
        if self.temperature > 0 and (self.rule != "exact" or self.min_block != 1 or self.propose != "argmax"):
            raise ValueError("sampling (temperature > 0) accepts by speculative sampling's own rule, which keeps "
                             "the samples' distribution: use the exact rule, min_block 1, argmax proposals")
        check_seed(self.seed)
        if self.seed != 0 and self.temperature == 0:
            raise ValueError(f"seed={self.seed} is for sampling (temperature > 0); greedy and blockwise "
                             f"decoding draw nothing")
        if self.propose == "window" and self.rule != "eps":
            raise ValueError("window proposals are for the eps rule (they aim within eps levels)")
        if self.propose == "recycle" and not (self.rule == "exact" and self.k > 1 and self.min_block == 1):
            raise ValueError("recycled proposals are for the exact rule with k > 1 and min_block 1 (p1's own "
                             "choices, which only the exact rule keeps as they are)")
        if not (math.isfinite(self.prior_weight) and self.prior_weight >= 0):
            raise ValueError(f"prior_weight must be a number >= 0, got {self.prior_weight}")
        if not (math.isfinite(self.guard) and self.guard >= 0):
            raise ValueError(f"guard must be a number of levels >= 0 (0: off), got {self.guard}")

    def check(self, model: ImageTransformerSR) -> None:
        self.validate()
        K = model.cfg.n_blockwise
        if not 1 <= self.k <= K:
            raise ValueError(f"k={self.k}: this model has {K} blockwise heads, so k must be in 1..{K}")
        if self.prior_weight != 1 and model.lr_prior is None:
            raise ValueError("prior_weight needs a model with the learned input prior (lr_prior); "
                             "this model has none: use prior_weight=1")

    @property
    def mode(self) -> str:
        """The spec's MODE part: greedy, exact, exact-heads, oracle, sample, eps=E, eps-window=E,
        top-k=N or min-block=N."""
        self.validate()
        if self.temperature > 0:
            return "sample"
        if self.rule == "eps":
            return f"eps-window={self.eps}" if self.propose == "window" else f"eps={self.eps}"
        if self.rule == "topk":
            return f"top-k={self.top_k}"
        if self.rule == "oracle":
            return "oracle"
        if self.min_block > 1:
            return f"min-block={self.min_block}"
        if self.k == 1:
            return "greedy"
        return "exact" if self.propose == "recycle" else "exact-heads"

    @property
    def spec(self) -> str:
        """These options in the decode-mode grammar (canonical: DecodeOptions.parse(o.spec) == o)."""
        mode = self.mode
        parts = [mode] if mode == "greedy" else [mode, f"k={self.k}"]
        if self.min_block > 1 and not mode.startswith("min-block="):
            parts.append(f"min-block={self.min_block}")
        if self.prior_weight != 1:
            parts.append(f"w={_spec_number(self.prior_weight)}")
        if self.guard:
            parts.append(f"guard={_spec_number(self.guard)}")
        if self.temperature > 0:
            parts.append(f"T={_spec_number(self.temperature)}")
            if self.seed != 0:
                parts.append(f"seed={self.seed}")
        return ":".join(parts)

    @classmethod
    def parse(cls, spec: str, k: int | None = None, prior_weight: float | None = None,
              guard: float | None = None) -> "DecodeOptions":
        """A decode-mode spec (see SPEC_HELP) -> DecodeOptions. k, prior_weight, guard: the block
        size, input guidance and cell guard where the spec gives none (e.g. from a separate --k
        list or --prior-weight flag). Raises ValueError naming what is wrong."""
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(f"empty decode mode: use {SPEC_HELP}")
        head, *settings = [p.strip() for p in spec.strip().split(":")]
        name, eq, value = head.lower().replace("_", "-").partition("=")
        name = _MODE_ALIASES.get(name.replace("-", ""), name)

        def whole(key, text):
            if not _INT.fullmatch(text.strip()):
                raise ValueError(f"decode mode {spec!r}: {key}={text} is not a whole number")
            return int(text)

        def number(key, text):
            try:
                x = float(text)
            except ValueError:
                x = float("nan")
            if not math.isfinite(x):
                raise ValueError(f"decode mode {spec!r}: {key}={text} is not a number")
            return x

        fields = {}
        if name in ("greedy", "exact", "exact-heads", "oracle", "sample") and not eq:
            fields["rule"] = "oracle" if name == "oracle" else "exact"
        elif name in ("eps", "eps-window", "top-k", "min-block") and eq:
            v = whole(name, value)
            if v < (1 if name in ("top-k", "min-block") else 0):
                raise ValueError(f"decode mode {spec!r}: {name} must be >= {1 if name in ('top-k', 'min-block') else 0}")
            fields.update({"eps": {"rule": "eps", "eps": v}, "eps-window": {"rule": "eps", "eps": v, "propose": "window"},
                           "top-k": {"rule": "topk", "top_k": v}, "min-block": {"rule": "exact", "min_block": v}}[name])
        else:
            raise ValueError(f"unknown decode mode {head!r} in {spec!r}: use {SPEC_HELP}")
        given = {}
        for item in settings:
            key, eq, value = item.partition("=")
            key = _KEYS.get(key.strip().lower())
            if not eq or key is None:
                raise ValueError(f"decode mode {spec!r}: unknown setting {item!r}; use k=K, w=G, guard=L, T=T, "
                                 f"seed=S or min-block=N")
            if key in given or (key == "min-block" and "min_block" in fields):
                raise ValueError(f"decode mode {spec!r}: {key} is given twice")
            given[key] = value.strip()
        if "k" in given:
            fields["k"] = whole("k", given["k"])
        elif name == "greedy":
            fields["k"] = 1
        elif k is not None:
            fields["k"] = int(k)
        else:
            raise ValueError(f"decode mode {spec!r}: say the block size, e.g. {head}:k=6")
        if name == "greedy" and fields["k"] != 1:
            raise ValueError(f"decode mode {spec!r}: greedy decodes one token per call (k=1); use exact:k={fields['k']}")
        if name == "exact-heads":
            fields["propose"] = "argmax"
        if "min-block" in given:
            fields["min_block"] = whole("min-block", given["min-block"])
        # input guidance and the cell guard: the spec's, else the caller's
        for key, field, caller, rule in (("w", "prior_weight", prior_weight, "w (the input guidance) must be >= 0"),
                                         ("guard", "guard", guard, "guard (levels) must be >= 0 (0: off)")):
            if key in given:
                fields[field] = number(key, given[key])
                if fields[field] < 0:
                    raise ValueError(f"decode mode {spec!r}: {rule}")
            elif caller is not None:
                fields[field] = float(caller)
        if name == "sample":
            if "T" not in given:
                raise ValueError(f"decode mode {spec!r}: sample needs a temperature, e.g. {spec}:T=0.8")
            fields["temperature"] = number("T", given["T"])
            if fields["temperature"] <= 0:
                raise ValueError(f"decode mode {spec!r}: sampling needs T > 0 (T=0 is greedy decoding)")
            if "seed" in given:
                fields["seed"] = whole("seed", given["seed"])
        elif "T" in given or "seed" in given:
            raise ValueError(f"decode mode {spec!r}: T and seed are for the sample mode ({name} draws nothing)")
        opts = cls(**fields)
        try:
            opts.validate()
        except ValueError as e:
            raise ValueError(f"decode mode {spec!r}: {e}") from None
        return opts

    @property
    def is_exact(self) -> bool:
        """Output identical to greedy decoding (by construction; see tests)."""
        return self.temperature == 0 and self.min_block == 1 and (
            self.k == 1 or self.rule == "exact" or (self.rule == "eps" and self.eps == 0)
            or (self.rule == "topk" and self.top_k == 1))


@dataclass
class DecodeStats:
    calls: int  # model calls this image took part in (the first, prefix-free call included)
    block_hist: list[int]  # block_hist[n-1] = number of steps that accepted n tokens
    seconds: float  # wall time from the start of the decode until this image finished
    tokens: int = SEQ_LEN

    @property
    def mean_block(self) -> float:
        """Mean accepted block size: tokens per decoding step (the paper's Table 2 measure)."""
        return self.tokens / max(1, sum(self.block_hist))

    def to_dict(self) -> dict:
        return {"calls": self.calls, "block_hist": self.block_hist, "seconds": self.seconds,
                "mean_block": self.mean_block}


@dataclass
class DecodeResult:
    images: np.ndarray  # (B, 32, 32, 3) uint8
    stats: list[DecodeStats]
    block_map: np.ndarray  # (B, 3072) length of the accepted block each token came from
    seconds: float  # wall time of the whole batch
    calls: int = 0  # batched model calls
    extra: dict = field(default_factory=dict)


def pooled_block_hist(stats: list[DecodeStats]) -> tuple[np.ndarray, float]:
    """Block histograms summed over images, and the mean accepted block they give: all tokens /
    all decoding steps (the paper's Table 2 measure over a test set)."""
    hist = np.zeros(max(len(s.block_hist) for s in stats), dtype=np.int64)
    for s in stats:
        hist[: len(s.block_hist)] += s.block_hist
    return hist, SEQ_LEN * len(stats) / int(hist.sum())


# ---------------------------------------------------------------- acceptance rules
# Each rule: proposals p (b, k-1) (heads 2..k's) and p1's logits lg (b, k-1, 256) at the positions
# that predict them -> (b, k-1) bool, which proposals p1 accepts one by one. A block keeps the
# sure first token plus the longest accepted prefix of the rest.

def accept_exact(p: torch.Tensor, lg: torch.Tensor, opts: DecodeOptions) -> torch.Tensor:
    """The paper's exact rule: the proposal is p1's argmax (the output is greedy decoding's)."""
    return p == lg.argmax(-1)


def accept_eps(p: torch.Tensor, lg: torch.Tensor, opts: DecodeOptions) -> torch.Tensor:
    """Approximate: within opts.eps intensity levels of p1's argmax."""
    return (p - lg.argmax(-1)).abs() <= opts.eps


def accept_topk(p: torch.Tensor, lg: torch.Tensor, opts: DecodeOptions) -> torch.Tensor:
    """Approximate: among p1's opts.top_k most likely values."""
    return (lg.topk(opts.top_k, dim=-1).indices == p.unsqueeze(-1)).any(-1)


def accept_oracle(p: torch.Tensor, lg: torch.Tensor, opts: DecodeOptions) -> torch.Tensor:
    """Everything: k tokens per call, the speed upper bound (not a decoder)."""
    return torch.ones_like(p, dtype=torch.bool)


ACCEPT = {"exact": accept_exact, "eps": accept_eps, "topk": accept_topk, "oracle": accept_oracle}


def accepted_length(props: torch.Tensor, verify_logits: torch.Tensor, opts: DecodeOptions) -> torch.Tensor:
    """props: (B, k) proposals; verify_logits: (B, k, 256) p1 at the positions that predict
    props[:, 1:] (the last row predicts the token after the block). Returns (B,) accepted counts
    in 1..k: the sure first token plus the longest prefix of the rest that opts.rule accepts,
    at least opts.min_block."""
    B, k = props.shape
    if k == 1:
        return torch.ones(B, dtype=torch.long, device=props.device)
    ok = ACCEPT[opts.rule](props[:, 1:], verify_logits[:, : k - 1], opts)
    n = 1 + ok.long().cumprod(dim=1).sum(dim=1)
    return n.clamp(min=opts.min_block)


ENGINES = ("auto", "native", "torch")


def not_native(model: ImageTransformerSR) -> str | None:
    """Why the native engine cannot decode this model here, or None where it can."""
    if next(model.parameters()).device.type != "cpu":
        return "the native engine runs on the CPU"
    if native.supports(model):
        return native.supports(model)
    if not native.available():
        return native.build_problem()
    return None


def engine_for(model: ImageTransformerSR, opts: DecodeOptions, engine: str = "auto") -> str:
    """Which engine decodes: "native" (sr_blockwise/engine.cpp: a whole blockwise step of a
    batch in one call, float32 arithmetic) wherever it can, else "torch" (the PyTorch step:
    head1='layer' models, GPUs, machines without a C++ compiler)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose from {ENGINES}")
    why = not_native(model)
    if engine == "native" and why:
        raise ValueError(why)
    return "torch" if (engine == "torch" or why) else "native"


@torch.no_grad()
def decode(model: ImageTransformerSR, lr, opts: DecodeOptions | None = None, progress=None,
           progress_every: int = 64, proposer=None, seeds=None, engine: str = "auto") -> DecodeResult:
    """Decode a batch of 8x8 inputs (B,8,8,3) uint8 into 32x32 faces.
    progress(tokens (B,3072) np, done_counts (B,) np, block_map (B,3072) np, calls): called
    every `progress_every` model calls, for live display. proposer: see _propose. seeds: one
    sampling seed per image (temperature > 0), so a sample does not depend on its batch.
    engine: see engine_for; exact mode equals greedy decoding on the same engine."""
    opts = opts or DecodeOptions()
    opts.check(model)
    if proposer is not None and opts.temperature > 0 and opts.k > 1:
        raise ValueError("speculative sampling verifies the heads' draft distributions: not with a proposer")
    lr = check_input(lr)
    if seeds is not None and len(seeds) != len(lr):
        raise ValueError(f"got {len(seeds)} seeds for {len(lr)} images")
    if progress is not None and (not isinstance(progress_every, int) or progress_every < 1):
        raise ValueError(f"progress_every must be an integer >= 1, got {progress_every!r}")
    if engine_for(model, opts, engine) == "native":
        return _decode_native(model, lr, opts, progress, progress_every, proposer, seeds)
    # the torch engine: start (prefill and the first proposals), then a call per block: verify
    # the proposals, commit what the rule accepts, propose the next block from the last state
    s = _start(model, lr, opts, seeds, proposer)
    while len(s.rows):
        _take_last_tokens(s)
        if not len(s.rows):
            break
        h, n, verified = _verify(model, s, opts)
        h_next, verified = _commit(s, h, n, verified)
        if len(s.rows):
            s.props, s.qlog = _propose(model, h_next, s.k, opts, opts.prior_weight, s.gen, s.t[s.rows], s.rows,
                                       s.src, s.out, proposer, verified, s.recycled)
        if progress is not None and s.n_calls % progress_every == 0:
            progress(s.out[:, :SEQ_LEN].cpu().numpy(), s.t.cpu().numpy(), s.bmap[:, :SEQ_LEN].cpu().numpy(),
                     s.n_calls)
    return _finish(s, progress)


# ---------------------------------------------------------------- the cell guard

# how steeply the cell guard's penalty grows: nats per level of the cell's mean offset past the
# tolerance (experiments/cell-guard/: 1 left a quarter of the collapses, 4 and 8 none)
GUARD_SLOPE = 4.0


def _cell_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """For each position: the 16 positions of its 4x4 cell and channel, in decoding order
    (3072, 16), and the index of its cell's pixel in the 8x8 input's 192 intensities (3072,)."""
    p = torch.arange(SEQ_LEN)
    row, col, ch = p // 96, (p // 3) % 32, p % 3
    dr, dc = torch.arange(4).repeat_interleave(4), torch.arange(4).repeat(4)
    cell = (row[:, None] // 4 * 4 + dr) * 96 + (col[:, None] // 4 * 4 + dc) * 3 + ch[:, None]
    return cell, (row // 4) * 24 + (col // 4) * 3 + ch


CELL_POSITIONS, CELL_INPUT = _cell_tables()


def cell_guard(logits: torch.Tensor, src: torch.Tensor, pos: torch.Tensor, tokens: torch.Tensor,
               guard: float) -> torch.Tensor:
    """p1's logits (B, ..., 256) at positions pos (B, ...) with the cell guard: at each intensity
    v, minus GUARD_SLOPE * max(0, |D + v - x| / 16 - guard), where x is the 8x8 input's (src (B,
    192)) pixel under the position and D the sum of (token - x) over the positions of its 4x4
    cell and channel before it: the cell's mean offset from x if its other pixels came out at x.
    tokens (B, >= 3072) hold every token before each position (those after it do not count). A
    greedy decode that collapses drifts a cell's mean far off its input pixel (the final mean of a
    real face's cell is its input pixel, and its running D / 16 stays under 55 levels:
    experiments/cell-guard/); the guard pulls the cell back once it is past `guard` levels and
    leaves every other position's logits as they are. guard 0: the logits unchanged."""
    if not guard:
        return logits
    B = pos.shape[0]
    pos = pos.clamp(max=SEQ_LEN - 1)
    x = src.gather(1, CELL_INPUT.to(pos.device)[pos].reshape(B, -1)).view_as(pos)
    cell = CELL_POSITIONS.to(pos.device)[pos]  # (B, ..., 16)
    decoded = tokens.gather(1, cell.reshape(B, -1)).view_as(cell)
    D = ((decoded - x[..., None]) * (cell < pos[..., None])).sum(-1)
    v = torch.arange(logits.shape[-1], device=logits.device)
    over = (D[..., None] + v - x[..., None]).abs().to(logits.dtype) / 16 - guard
    return logits - GUARD_SLOPE * over.clamp(min=0)


def _with_block(s: "_Batch", rows: torch.Tensor, tr: torch.Tensor) -> torch.Tensor:
    """Images rows' tokens (b, 3072 + k) with the block being verified written after their
    confirmed tr: every token before each position the call predicts."""
    tokens = s.out[rows].clone()
    tokens.scatter_(1, tr[:, None] + torch.arange(s.k, device=tr.device), s.props)
    return tokens


# ---------------------------------------------------------------- the torch engine's stages

@dataclass
class _Batch:
    """A batch decoding on the torch engine: every image's tokens so far and its statistics, and
    the images still decoding (`rows`) with their current block's proposals."""
    src: torch.Tensor  # (B, 192) the 8x8 inputs
    cache: object  # model.KVCache
    k: int
    speculative: bool  # sampling with k > 1
    gen: tuple | None  # _sampling_noise's tables when sampling
    out: torch.Tensor  # (B, 3072 + k) confirmed tokens (past the end: room for a block's writes)
    bmap: torch.Tensor  # (B, 3072 + k) length of the block each token came from
    t: torch.Tensor  # (B,) confirmed tokens per image
    hist: torch.Tensor  # (B, k) accepted block sizes' histogram
    calls: torch.Tensor  # (B,) model calls each image took part in
    finish: np.ndarray  # (B,) seconds from t0 until the image was finished
    t0: float
    rows: torch.Tensor = None  # images still decoding
    props: torch.Tensor = None  # (len(rows), k) their proposals; the first is the sure token
    # propose="recycle": per row, p1's argmax (k-1,) at the positions after the next sure token that
    # the last call computed, and how many of them there are (see _verify); else None
    recycled: tuple | None = None
    qlog: torch.Tensor | None = None  # speculative sampling: the logits the drafts were drawn from
    n_calls: int = 1  # batched model calls


def _start(model, lr, opts: DecodeOptions, seeds, proposer) -> _Batch:
    """Prefill: encode the inputs, run the first (prefix-free) call, and propose every image's
    first block from it."""
    dev = next(model.parameters()).device
    src = torch.from_numpy(to_tokens(lr)).to(dev)
    B, k = src.shape[0], opts.k
    t0 = time.perf_counter()
    cache = model.new_cache(src, max_extra=max(16, k))
    speculative = opts.temperature > 0 and k > 1
    s = _Batch(src, cache, k, speculative,
               gen=_sampling_noise(B, opts, dev, seeds, speculative) if opts.temperature > 0 else None,
               out=torch.zeros(B, SEQ_LEN + k, dtype=torch.long, device=dev),
               bmap=torch.zeros(B, SEQ_LEN + k, dtype=torch.long, device=dev),
               t=torch.zeros(B, dtype=torch.long, device=dev), hist=torch.zeros(B, k, dtype=torch.long),
               calls=torch.ones(B, dtype=torch.long), finish=np.zeros(B), t0=t0)
    h = model.step(cache, torch.full((B, 1), -1, dtype=torch.long, device=dev),
                   torch.zeros(B, dtype=torch.long, device=dev))[:, 0]
    s.rows = torch.arange(B, device=dev)
    s.props, s.qlog = _propose(model, h, k, opts, opts.prior_weight, s.gen, s.t, s.rows, src, s.out, proposer)
    return s


def _take_last_tokens(s: _Batch) -> None:
    """Images with one token left take their sure token without a call, and leave the batch."""
    tr = s.t[s.rows]
    last = SEQ_LEN - tr == 1
    if not last.any():
        return
    r = s.rows[last]
    s.out[r, tr[last]] = s.props[last, 0]
    s.bmap[r, tr[last]] = 1
    s.hist[r.cpu(), 0] += 1
    s.t[r] += 1
    s.finish[r.cpu().numpy()] = time.perf_counter() - s.t0
    keep = ~last
    s.rows, s.props = s.rows[keep], s.props[keep]
    s.qlog = s.qlog[keep] if s.qlog is not None else None


def _verify(model, s: _Batch, opts: DecodeOptions):
    """One model call feeds every image's k proposals; p1 at those positions decides how many are
    accepted. -> (the call's decoder states (b, k, d), accepted counts (b,), and for speculative
    sampling what the next block's first token is drawn from (see _propose's `verified`))."""
    rows, k, B = s.rows, s.k, len(s.t)
    tr = s.t[rows]
    h = model.step(s.cache, s.props, tr + 1, rows=None if len(rows) == B else rows)  # (b, k, d)
    s.n_calls += 1
    s.calls[rows.cpu()] += 1
    ar = torch.arange(k, device=h.device)
    verified = None
    pos = (tr + 1)[:, None] + ar

    def p1_logits():  # at the k positions the call predicts, guarded where opts.guard says
        z = model.logits(h, s.src[rows], pos, opts.prior_weight)
        return cell_guard(z, s.src[rows], pos, _with_block(s, rows, tr), opts.guard) if opts.guard else z

    if s.speculative:
        plog = p1_logits()
        u = s.gen[1][rows[:, None], (tr[:, None] + ar[1:]).clamp(max=SEQ_LEN - 1)]
        n = speculative_accepted_length(s.props, plog, s.qlog, u, opts.temperature)
        # the next block's sure token: p1's logits there are this call's (no second out_proj),
        # and where draft n was rejected it is drawn from max(0, p - q) for that draft's q
        b_ar = torch.arange(len(rows), device=h.device)
        verified = (plog[b_ar, n - 1], s.qlog[b_ar, (n - 1).clamp(max=k - 2)], n < k)
    elif k > 1:
        logits = p1_logits()
        n = accepted_length(s.props, logits, opts)
        if opts.propose == "recycle":
            # the next block's sure token is p1's argmax at n - 1; its proposals at positions
            # t + n + 1 .. t + k are p1's argmax at n .. k - 1, read past the rejected proposal n
            idx = n[:, None] + torch.arange(k - 1, device=h.device)
            s.recycled = (logits.argmax(-1).gather(1, idx.clamp(max=k - 1)), k - n)
    else:
        n = torch.ones(len(rows), dtype=torch.long, device=h.device)
    return h, torch.minimum(n, SEQ_LEN - tr), verified


def _commit(s: _Batch, h, n, verified):
    """Write each image's n accepted tokens, count the block, and drop finished images. -> (the
    decoder state at each live image's last accepted position, which gives its next block's
    proposals; `verified` of the live images)."""
    rows, k = s.rows, s.k
    tr = s.t[rows]
    ar = torch.arange(k, device=h.device)
    # positions past n are masked out of the write
    pos = tr[:, None] + ar
    keep_tok = ar[None, :] < n[:, None]
    s.out[rows[:, None].expand(-1, k)[keep_tok], pos[keep_tok]] = s.props[keep_tok]
    s.bmap[rows[:, None].expand(-1, k)[keep_tok], pos[keep_tok]] = n[:, None].expand(-1, k)[keep_tok]
    s.hist[rows.cpu(), (n - 1).cpu()] += 1
    s.t[rows] = tr + n
    done = s.t[rows] >= SEQ_LEN
    if done.any():
        s.finish[rows[done].cpu().numpy()] = time.perf_counter() - s.t0
    h_next = h[torch.arange(len(rows), device=h.device), n - 1]
    live = ~done
    s.rows = rows[live]
    if s.recycled is not None:
        s.recycled = tuple(x[live] for x in s.recycled)
    return h_next[live], (tuple(x[live] for x in verified) if verified is not None else None)


def _finish(s: _Batch, progress) -> DecodeResult:
    seconds = time.perf_counter() - s.t0
    tokens = s.out[:, :SEQ_LEN].clamp(0, 255).cpu().numpy()
    stats = [DecodeStats(int(s.calls[i]), s.hist[i].tolist(), float(s.finish[i])) for i in range(len(tokens))]
    if progress is not None:
        progress(tokens, s.t.cpu().numpy(), s.bmap[:, :SEQ_LEN].cpu().numpy(), s.n_calls)
    return DecodeResult(from_tokens(tokens), stats, s.bmap[:, :SEQ_LEN].cpu().numpy().astype(np.uint8),
                        seconds, s.n_calls, {"engine": "torch"})


CALLS_PER_CROSSING = 256  # at most, from Python into the engine: ~0.01 s at batch 1, ~0.5 s at batch 64


def _decode_native(model, lr, opts, progress, progress_every, proposer, seeds=None) -> DecodeResult:
    """decode on the native engine: one call per blockwise step of the whole batch, several calls
    a crossing from Python (Batch.iterate's max_calls); the loop here only notes when images
    finish, reports progress and hands proposals to a `proposer` if one is given. Sampling reads
    the same per-image noise tables as the torch engine (_sampling_noise)."""
    t0 = time.perf_counter()
    src = torch.from_numpy(to_tokens(lr)).cpu()
    B, k = len(lr), opts.k
    batch = native.Batch(model, src, k, opts.prior_weight, opts.guard, GUARD_SLOPE)
    window = opts.eps if opts.propose == "window" and opts.eps > 0 else 0
    if opts.temperature > 0:
        batch.sample_with(_sampling_noise(B, opts, "cpu", seeds, speculative=k > 1))
        copts = batch.options("sample", temperature=opts.temperature)
    else:
        copts = batch.options(opts.rule, opts.eps, opts.top_k, opts.min_block, window,
                              recycle=opts.propose == "recycle")
    rows = torch.arange(B, dtype=torch.int64)
    batch.start(copts, rows)
    if proposer is not None and k > 1:
        batch.props[:, 1:] = proposer(batch.t.clone(), rows.clone(), k)
    finish = np.zeros(B)
    live, n_calls = B, 1
    t = batch.t.numpy()  # a view: the engine updates it in place
    while live:
        was = live
        # as many calls in one crossing as nothing here needs between them (an outside proposer
        # every call, progress every progress_every), up to CALLS_PER_CROSSING (Ctrl-C is seen
        # between crossings); the engine returns when an image finishes
        calls = 1 if proposer is not None and k > 1 else CALLS_PER_CROSSING
        if progress is not None:
            calls = min(calls, progress_every - n_calls % progress_every)
        live, made = batch.iterate(copts, rows, live, propose=proposer is None, max_calls=calls)
        n_calls += made
        if live < was:  # the images that finished in the last call
            finish[(t >= SEQ_LEN) & (finish == 0)] = time.perf_counter() - t0
        if proposer is not None and k > 1 and live:
            r = rows[:live].clone()
            batch.props[r, 1:] = proposer(batch.t[r], r, k).to(torch.int64)
        if progress is not None and n_calls % progress_every == 0:
            progress(batch.tokens[:, :SEQ_LEN].numpy().copy(), batch.t.numpy().copy(), batch.block_map.numpy().copy(), n_calls)
    seconds = time.perf_counter() - t0
    tokens = batch.tokens[:, :SEQ_LEN].numpy().copy()
    stats = [DecodeStats(int(batch.calls[i]), batch.hist[i].tolist(), float(finish[i])) for i in range(B)]
    if progress is not None:
        progress(tokens, batch.t.numpy().copy(), batch.block_map.numpy().copy(), n_calls)
    return DecodeResult(from_tokens(tokens), stats, batch.block_map.numpy().copy(), seconds, n_calls,
                        {"engine": "native"})


@torch.no_grad()
def exact_block_stats(model: ImageTransformerSR, lr, greedy_images, ks, chunk: int = 64,
                      prior_weight: float = 1.0, engine: str = "auto") -> dict:
    """exact-heads mode's accepted blocks (the exact rule with the heads' proposals alone, the
    paper's) for every k in ks, without decoding it: {k: [DecodeStats]}. (exact mode proper also
    recycles logits read past a rejected proposal, which no pass over the greedy output computes.)

    In exact mode the output is the greedy output, so every call's prefix is a greedy prefix, and
    a decoder state depends only on its prefix, never on the call it comes in (tests/test_model.py).
    So one teacher-forced pass of `step` over the greedy tokens, `chunk` positions per call, gives
    every state the decoder would see; the heads read at position t give the proposals a block
    starting at t would get, and walking the image as `decode` does (accept the sure token, then
    the proposals that equal greedy's next tokens) reproduces its accepted blocks and calls for
    all k at once, at the cost of about one verify call per `chunk` tokens. `seconds` is 0: this
    is not a timing. prior_weight: the greedy outputs' (DecodeOptions.prior_weight). Raises if p1's argmax anywhere differs from the greedy token given (then the
    states are not the decoder's and the walk would be wrong)."""
    lr = check_input(lr)
    greedy_images = np.asarray(greedy_images)
    B = len(lr)
    if greedy_images.shape != (B, 32, 32, 3):
        raise ValueError(f"expected {B} greedy outputs of shape (32, 32, 3), got {greedy_images.shape}")
    ks = sorted(set(ks))
    if not 1 <= min(ks) <= max(ks) <= model.cfg.n_blockwise:
        raise ValueError(f"k must be in 1..{model.cfg.n_blockwise}, got {ks}")
    if engine_for(model, DecodeOptions(prior_weight=prior_weight), engine) == "native":
        agree = _agreement_native(model, lr, greedy_images, ks, prior_weight)
    else:
        agree = _agreement_torch(model, lr, greedy_images, ks, chunk, prior_weight)
    out = {}
    for k in ks:
        # block accepted at each t, as Python ints: the walk below reads one per step
        runs = (agree[k].long().cumprod(-1).sum(-1) + 1).tolist()
        stats = []
        for b in range(B):
            hist, calls, t = [0] * k, 1, 0
            while t < SEQ_LEN:
                n = 1 if SEQ_LEN - t == 1 else min(runs[b][t], SEQ_LEN - t)
                calls += SEQ_LEN - t > 1  # the last single token needs no call
                hist[n - 1] += 1
                t += n
            stats.append(DecodeStats(calls, hist, 0.0))
        out[k] = stats
    return out



def _agreement_torch(model, lr, greedy_images, ks, chunk, prior_weight):
    """exact_block_stats' agreement tables on the torch engine: {k: (B, 3072, k-1) bool}."""
    dev = next(model.parameters()).device
    src = torch.from_numpy(to_tokens(lr)).to(dev)
    B = src.shape[0]
    y = torch.from_numpy(to_tokens(greedy_images)).to(dev)
    cache = model.new_cache(src, max_extra=chunk)
    prev = torch.cat([torch.full((B, 1), -1, dtype=torch.long, device=dev), y[:, :-1]], 1)
    later = torch.cat([y, y[:, -1:].expand(B, max(ks))], 1)  # past the end: padding, never read
    # agree[k][b, t, j]: head j+2 of a k-head block starting at t proposes greedy's token t+j+1
    agree = {k: torch.zeros(B, SEQ_LEN, max(k - 1, 0), dtype=torch.bool) for k in ks}
    for s in range(0, SEQ_LEN, chunk):
        h = model.step(cache, prev[:, s:s + chunk], torch.full((B,), s, device=dev))
        n = h.shape[1]
        pos = s + torch.arange(n, device=dev).expand(B, n)
        if not torch.equal(model.logits(h, src, pos, prior_weight).argmax(-1), y[:, s:s + n]):
            raise ValueError("these are not the model's greedy tokens (p1 disagrees): cannot replay")
        for k in [k for k in ks if k > 1]:  # k=1 has no proposals: every block is 1 token
            props = model.head_logits(h, k, src, pos, y, prior_weight).argmax(-1)[..., 1:]  # (B, n, k-1)
            want = torch.stack([later[:, s + j + 1:s + j + 1 + n] for j in range(k - 1)], -1)
            agree[k][:, s:s + n] = (props == want).cpu()
    return agree


def _agreement_native(model, lr, greedy_images, ks, prior_weight):
    """exact_block_stats' agreement tables on the native engine: the states of a teacher-forced
    pass over the greedy tokens, 16 per call, and each position's block drafted from them."""
    src = torch.from_numpy(to_tokens(lr))
    y = torch.from_numpy(to_tokens(greedy_images))
    B, K = len(lr), max(ks)
    batch = native.Batch(model, src, K, prior_weight)
    copts = batch.options()
    later = torch.cat([y, y[:, -1:].expand(B, K)], 1)  # past the end: padding, never read
    agree = {k: torch.zeros(B, SEQ_LEN, max(k - 1, 0), dtype=torch.bool) for k in ks}
    chunk = native.MAX_TOKENS
    for b in range(B):
        prev = torch.cat([torch.tensor([-1]), y[b, :-1]])
        for s in range(0, SEQ_LEN, chunk):
            h, z = batch.step(b, prev[s:s + chunk], s)
            if not torch.equal(z.argmax(-1), y[b, s:s + len(h)]):
                raise ValueError("these are not the model's greedy tokens (p1 disagrees): cannot replay")
            if K == 1:
                continue
            for i in range(0, len(h), B):  # draft takes up to B states at a time
                pos = torch.arange(s + i, s + min(i + B, len(h)))
                props = batch.draft(copts, b, h[i:i + B], pos, y[b, pos], y[b])[:, 1:]
                want = torch.stack([later[b, pos + j + 1] for j in range(K - 1)], -1)
                for k in ks:
                    if k > 1:
                        agree[k][b, pos] = (props[:, :k - 1] == want[:, :k - 1])
    return agree


def _propose(model, h, k, opts, w, gen, t, rows, src, out, proposer=None, verified=None, recycled=None):
    """k proposals from the decoder state h (b, d) that predicts position t (b,) of images `rows`
    of the batch's input src, whose confirmed tokens are out[rows, :t], at guidance weight w
    (opts.prior_weight, as decode passes it). The first is always
    p1's own choice, with the cell guard where opts has it (so it needs no verification); the others come from the heads, or from
    `proposer(t, rows, k)` -> (b, k-1) tokens when one is given (e.g. a draft model).
    Sampling (gen: _sampling_noise's tables): the first token is p1's sample; heads 2..k then
    sample their drafts. verified: after a speculative call, (p1's logits at h (b, 256), the
    logits q (b, 256) of the draft verified there, whether it was rejected (b,)): where it was,
    the first token is drawn from max(0, p1 - q). recycled: (tokens (b, k-1), counts (b,)): the
    first counts[i] proposals after the sure token are given (opts.propose "recycle"; _verify).
    -> (proposals (b, k), the drafts' logits (b, k-1, 256) when sampling with k > 1, else None)."""
    def p1(z):  # p1's logits z at t, guarded where opts.guard says
        return cell_guard(z, src[rows], t, out[rows], opts.guard) if opts.guard else z

    if opts.temperature > 0:
        T = opts.temperature
        raw = p1(model.logits(h, src[rows], t, w)) if verified is None else verified[0]
        logits = raw.float() / T
        if verified is not None:
            residual = residual_logits(raw, verified[1], T)
            rejected = verified[2] & residual.isfinite().any(-1)  # p == q leaves no residual: p
            logits = torch.where(rejected[:, None], residual, logits)
        first = (logits + gen[0][rows, t]).argmax(-1)
        if k == 1:
            return first[:, None], None
        targets = (t[:, None] + torch.arange(1, k, device=t.device)).clamp(max=SEQ_LEN - 1)
        # the drafts' positions' Gumbel noise (b, k-1, 256), times T: argmax(z + T g) = argmax(z / T + g),
        # and the temperature stays out of the compiled draft_heads (a new T compiles nothing new)
        noise = gen[2][rows[:, None], targets] * T
        return model.draft_heads(h, k, src[rows], t, out[rows], lambda z, i: (z.float() + noise[:, i]).argmax(-1),
                                 w, with_logits=True, first=first)
    if proposer is None:
        # p1's own choice is always its argmax: it is the sure token (draft_heads computes it
        # unguarded, so with the guard it is given)
        window = opts.propose == "window" and opts.eps > 0
        first = p1(model.logits(h, src[rows], t, w)).argmax(-1) if opts.guard else None
        return model.draft_heads(h, k, src[rows], t, out[rows],
                                 (lambda z, i: window_centre(z, opts.eps)) if window else None, w,
                                 first=first, given=recycled), None
    first = p1(model.logits(h, src[rows], t, w)).argmax(-1, keepdim=True)
    return (torch.cat([first, proposer(t, rows, k).to(first)], dim=1) if k > 1 else first), None


def window_centre(logits: torch.Tensor, eps: int) -> torch.Tensor:
    """(..., 256) logits -> (...) the intensity v that maximizes P(|x - v| <= eps)."""
    p = logits.float().softmax(-1)
    mass = F.avg_pool1d(p.reshape(-1, 1, p.shape[-1]), 2 * eps + 1, stride=1, padding=eps,
                        count_include_pad=True)  # window sums / (2 eps + 1): same argmax
    return mass.view(p.shape).argmax(-1)


def _sampling_noise(B, opts, dev, seeds=None, speculative=False):
    """Per-image noise from a per-image generator, by position, so that an image's sample does not
    depend on its batch (with `seeds`, one per image; by default image i gets seed*1_000_003 + i):
    (Gumbel noise for each position's sure token (B, 3072, 256), and for speculative sampling the
    acceptance uniforms (B, 3072) and the drafts' Gumbel noise (B, 3072, 256)). A position's
    noise is used once for what is kept there: a draft redrawn after an earlier rejection reuses
    it, but the discarded draft decided nothing that was kept."""
    first = torch.empty(B, SEQ_LEN, 256)
    accept, draft = (torch.empty(B, SEQ_LEN), torch.empty(B, SEQ_LEN, 256)) if speculative else (None, None)
    for i in range(B):
        g = torch.Generator().manual_seed(int(seeds[i]) if seeds is not None else opts.seed * 1_000_003 + i)
        first[i] = _gumbel(g, (SEQ_LEN, 256))  # drawn first: k=1 samples as before speculative sampling
        if speculative:
            accept[i] = torch.rand(SEQ_LEN, generator=g)
            draft[i] = _gumbel(g, (SEQ_LEN, 256))
    return tuple(x.to(dev) if x is not None else None for x in (first, accept, draft))


def _gumbel(g, shape):
    u = torch.rand(shape, generator=g).clamp_(1e-10, 1 - 1e-7)
    return -torch.log(-torch.log(u))


def residual_logits(p_logits, q_logits, temperature: float) -> torch.Tensor:
    """log max(0, p - q), unnormalized (-inf where p <= q), for p = softmax(p_logits / T) and
    q = softmax(q_logits / T): where a draft sampled from q was rejected, the token drawn from
    this instead makes the token's distribution exactly p."""
    p = (p_logits.float() / temperature).softmax(-1)
    return (p - (q_logits.float() / temperature).softmax(-1)).clamp(min=0).log()


def speculative_accepted_length(props, p_logits, q_logits, u, temperature: float) -> torch.Tensor:
    """Speculative sampling's acceptance (Leviathan et al. 2023; Chen et al. 2023): props (b, k)
    (the first is already p1's sample), p_logits (b, k, 256) p1 at the positions that predict
    props[:, 1:], q_logits (b, k-1, 256) what the drafts props[:, 1:] were sampled from, u (b, k-1)
    uniforms. Draft i is kept with probability min(1, p(x)/q(x)) while all before it were.
    Returns (b,) accepted counts in 1..k."""
    x = props[:, 1:, None]
    p = (p_logits[:, :-1].float() / temperature).softmax(-1).gather(-1, x)[..., 0]
    q = (q_logits.float() / temperature).softmax(-1).gather(-1, x)[..., 0]
    ok = u * q < p  # u < p / q without dividing
    return 1 + ok.long().cumprod(dim=1).sum(dim=1)


def greedy(model, lr, **kw) -> DecodeResult:
    return decode(model, lr, DecodeOptions(k=1), **kw)


@torch.no_grad()
def greedy_uncached(model: ImageTransformerSR, lr, max_tokens: int = SEQ_LEN,
                    prior_weight: float = 1.0) -> tuple[np.ndarray, float]:
    """Greedy decoding as the paper's reference code runs it: no KV cache, every step re-runs the
    whole prefix through the full forward. For timing only (slow: use max_tokens to time a
    prefix). Returns (tokens (B, max_tokens), seconds)."""
    lr = check_input(lr)
    dev = next(model.parameters()).device
    src = torch.from_numpy(to_tokens(lr)).to(dev)
    B = src.shape[0]
    tgt = torch.zeros(B, SEQ_LEN, dtype=torch.long, device=dev)
    t0 = time.perf_counter()
    L = model.cfg.block_len
    for i in range(max_tokens):
        T = (i // L + 1) * L  # the prefix, rounded up to whole attention blocks
        h = model(src, tgt[:, :T])
        tgt[:, i] = model.logits(h[:, i], src, torch.full((B,), i, device=dev), prior_weight).argmax(-1)
    return tgt[:, :max_tokens].cpu().numpy(), time.perf_counter() - t0


def default_prior_weight(model: ImageTransformerSR) -> float:
    """The guidance weight the apps start from: DEFAULT_PRIOR_WEIGHT where the model has the
    learned input prior, else 1 (the only weight such a model takes)."""
    return DEFAULT_PRIOR_WEIGHT if model.lr_prior is not None else 1.0


MODES = ("greedy", "exact", "approx", "sample")
# the cell guard's tolerance the apps (upscale, the demo, Upscaler) decode greedy, exact and
# approximate mode with unless told otherwise: measured on 1,024 held-out faces
# (experiments/cell-guard/)
DEFAULT_GUARD = 32.0


def default_guard(mode: str) -> float:
    """The apps' cell guard for a mode (MODES): DEFAULT_GUARD where it was measured (greedy,
    exact, approx); sampling draws from the model's own distribution (0)."""
    return 0.0 if mode == "sample" else DEFAULT_GUARD
# the prior weight the apps (upscale, demo) decode with unless told otherwise: measured on 96
# held-out faces (experiments/input-guidance/)
DEFAULT_PRIOR_WEIGHT = 2.0
# the block size each mode of the apps decodes with unless told otherwise. On the native engine
# (2 threads) a 2-token call costs 1.2x a 1-token one and a 7-token call 2.0-3.0x, so exact mode is
# fastest at k=2 (sr-blockwise bench-decode, batch 1 / 16 / 64: 1.04x / 1.31x / 1.29x greedy
# against 1.01x / 1.27x / 1.08x at k=4 and 0.86x / 1.09x / 0.85x at k=6; the batch command's own
# timing, one run, has k=4 level with k=2 at batch 16 and 32: experiments/batch-speed/); approximate mode, with
# its window proposals, at k=4 (1.38-1.42x / 1.77-1.84x greedy at batch 1 / 16 against
# 1.22-1.24x / 1.42-1.60x at k=2: experiments/window-proposals/), and so is speculative sampling (batch 8:
# 1.56-1.85x plain sampling against 1.29-1.51x at k=2 and 1.33-1.65x at k=6: experiments/speculative-sampling/)
DEFAULT_K = {"greedy": 1, "exact": 2, "approx": 4, "sample": 4}


def options_for(mode: str, k: int | None = None, eps: int = 2, temperature: float = 1.0, seed: int = 0,
                prior_weight: float | None = None, guard: float | None = None) -> DecodeOptions:
    """The user-facing modes (upscale's --mode and its flags, the demo, Upscaler.options), as
    decode-mode specs: greedy (k=1), exact (exact:k=K, identical to greedy), approx
    (eps-window=E:k=K: a token within E levels of greedy's choice is kept, the heads proposing the
    centre of their most probable window, which gave longer blocks and a closer PSNR than their
    argmax: experiments/window-proposals/), sample (sample:k=K:T=T:seed=S; k > 1 by speculative
    sampling, with plain sampling's distribution); all at the given input-prior weight (w=G;
    None: DecodeOptions' default, 1) and cell guard (guard=L; None: DecodeOptions' default, 0,
    off). k None: the mode's DEFAULT_K."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    k = DEFAULT_K[mode] if k is None else k
    spec = {"greedy": "greedy", "exact": f"exact:k={k}", "approx": f"eps-window={eps}:k={k}",
            "sample": f"sample:k={k}:T={temperature}:seed={seed}"}[mode]
    return DecodeOptions.parse(spec, prior_weight=prior_weight, guard=guard)
