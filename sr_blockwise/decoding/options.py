"""How to decode: DecodeOptions and the decode-mode grammar that writes and reads them, and the
user-facing modes' defaults (options_for)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..model import ImageTransformerSR

RULES = ("exact", "eps", "topk", "oracle")
MAX_TREE = 1024  # candidates a tree verifies per call, at most
PROPOSALS = ("argmax", "window", "recycle")

# One grammar for decode modes, read by the upscale options, evaluate, bench-decode and the rating
# tool:   MODE[:k=K][:tree=N][:min-block=N][:w=G][:guard=L][:T=T][:seed=S]
# MODE is greedy (k=1), exact (recycled proposals), exact-heads (the paper's: the heads' alone),
# oracle, eps=E, eps-window=E, top-k=N, min-block=N (the exact rule, at least N tokens a call) or
# sample (temperature T > 0; k > 1 is speculative sampling). k: block
# size; tree: N candidates verified per call as a tree (tree.py; exact, eps, top-k and oracle; in
# exact mode a tree's nodes are the heads', as exact-heads'); min-block=N after eps / top-k / oracle; w: input guidance (prior_weight, default 1); guard:
# the cell guard's tolerance in levels (default 0, off); T and seed: sampling only. Settings come
# in any order; every mode but greedy needs k (a caller may fill it in:
# DecodeOptions.parse(spec, k=6)). DecodeOptions.spec writes the one canonical form:
# DecodeOptions.parse(o.spec) == o.
SPEC_MODES = ("greedy", "exact", "exact-heads", "oracle", "sample", "eps=E", "eps-window=E", "top-k=N",
              "min-block=N")
SPEC_HELP = ("MODE[:k=K][:tree=N][:min-block=N][:w=G][:guard=L][:T=T][:seed=S] with MODE one of " + ", ".join(SPEC_MODES)
             + " (e.g. exact:k=6, eps=2:k=6:w=2, exact:k=10:tree=64, sample:k=4:T=0.8)")
_MODE_ALIASES = {"topk": "top-k", "minblock": "min-block", "epswindow": "eps-window", "exactheads": "exact-heads"}
_KEYS = {"k": "k", "tree": "tree", "w": "w", "guard": "guard", "t": "T", "seed": "seed", "min-block": "min-block",
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


# ---------------------------------------------------------------- reading a decode-mode spec

def _whole(spec: str, key: str, text: str) -> int:
    """A setting's whole number, or ValueError naming the setting in the spec."""
    if not _INT.fullmatch(text.strip()):
        raise ValueError(f"decode mode {spec!r}: {key}={text} is not a whole number")
    return int(text)


def _number(spec: str, key: str, text: str) -> float:
    """A setting's finite number, or ValueError naming the setting in the spec."""
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not math.isfinite(x):
        raise ValueError(f"decode mode {spec!r}: {key}={text} is not a number")
    return x


def _mode_fields(spec: str, head: str) -> tuple[str, dict]:
    """The spec's MODE part: its name (aliases read as the canonical one) and the fields it sets."""
    name, eq, value = head.lower().replace("_", "-").partition("=")
    name = _MODE_ALIASES.get(name.replace("-", ""), name)
    if name in ("greedy", "exact", "exact-heads", "oracle", "sample") and not eq:
        return name, {"rule": "oracle" if name == "oracle" else "exact"}
    if name in ("eps", "eps-window", "top-k", "min-block") and eq:
        v = _whole(spec, name, value)
        if v < (1 if name in ("top-k", "min-block") else 0):
            raise ValueError(f"decode mode {spec!r}: {name} must be >= {1 if name in ('top-k', 'min-block') else 0}")
        return name, {"eps": {"rule": "eps", "eps": v}, "eps-window": {"rule": "eps", "eps": v, "propose": "window"},
                      "top-k": {"rule": "topk", "top_k": v}, "min-block": {"rule": "exact", "min_block": v}}[name]
    raise ValueError(f"unknown decode mode {head!r} in {spec!r}: use {SPEC_HELP}")


def _settings_given(spec: str, settings: list[str], fields: dict) -> dict[str, str]:
    """The settings after MODE by their canonical key; an unknown one or one given twice (min-block
    also as the MODE) is refused."""
    given = {}
    for item in settings:
        key, eq, value = item.partition("=")
        key = _KEYS.get(key.strip().lower())
        if not eq or key is None:
            raise ValueError(f"decode mode {spec!r}: unknown setting {item!r}; use k=K, tree=N, w=G, guard=L, T=T, "
                             f"seed=S or min-block=N")
        if key in given or (key == "min-block" and "min_block" in fields):
            raise ValueError(f"decode mode {spec!r}: {key} is given twice")
        given[key] = value.strip()
    return given


def _block_size(spec: str, head: str, name: str, given: dict, k: int | None) -> int:
    """The spec's k, else greedy's 1, else the caller's; greedy takes no other."""
    if "k" in given:
        block = _whole(spec, "k", given["k"])
    elif name == "greedy":
        block = 1
    elif k is not None:
        block = int(k)
    else:
        raise ValueError(f"decode mode {spec!r}: say the block size, e.g. {head}:k=6")
    if name == "greedy" and block != 1:
        raise ValueError(f"decode mode {spec!r}: greedy decodes one token per call (k=1); use exact:k={block}")
    return block


def _guidance_fields(spec: str, given: dict, prior_weight: float | None, guard: float | None) -> dict:
    """Input guidance and the cell guard: the spec's, else the caller's."""
    fields = {}
    for key, field, caller, rule in (("w", "prior_weight", prior_weight, "w (the input guidance) must be >= 0"),
                                     ("guard", "guard", guard, "guard (levels) must be >= 0 (0: off)")):
        if key in given:
            fields[field] = _number(spec, key, given[key])
            if fields[field] < 0:
                raise ValueError(f"decode mode {spec!r}: {rule}")
        elif caller is not None:
            fields[field] = float(caller)
    return fields


def _sampling_fields(spec: str, name: str, given: dict) -> dict:
    """The sample mode's temperature (required) and seed; the other modes take neither."""
    fields = {}
    if name == "sample":
        if "T" not in given:
            raise ValueError(f"decode mode {spec!r}: sample needs a temperature, e.g. {spec}:T=0.8")
        fields["temperature"] = _number(spec, "T", given["T"])
        if fields["temperature"] <= 0:
            raise ValueError(f"decode mode {spec!r}: sampling needs T > 0 (T=0 is greedy decoding)")
        if "seed" in given:
            fields["seed"] = _whole(spec, "seed", given["seed"])
    elif "T" in given or "seed" in given:
        raise ValueError(f"decode mode {spec!r}: T and seed are for the sample mode ({name} draws nothing)")
    return fields


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
    # > 0: sample at this temperature; with k > 1 by speculative sampling, which keeps plain
    # sampling's distribution. 0: greedy / blockwise
    temperature: float = 0.0
    seed: int = 0
    # where proposals 2..k come from: "argmax", the heads' argmax (the paper; the grammar's
    # exact-heads); "window" (eps rule), the centre of the head's most probable (2*eps+1)-wide
    # window; "recycle" (exact rule, the grammar's exact), the heads' argmax except where the last
    # call verified past its rejected proposal, where p1's own argmax from that call (in a tree,
    # on its rank-0 path). None: "recycle" where it applies (exact rule, k > 1, min_block 1, no
    # sampling), else "argmax"
    propose: str | None = None
    # input guidance: the weight of the model's learned prior over (intensity - the 8x8 input's
    # intensity of that cell and channel), in p1 and every head. 1: the model as trained; above 1
    # pulls every prediction toward the input. Exact mode equals greedy at the same weight.
    prior_weight: float = 1.0
    # the cell guard (cell_guard): > 0 pulls a 4x4 cell back while it is decoded once its mean
    # would end up more than this many levels off the cell's 8x8 input pixel; 0: off. It acts on
    # p1 (the heads propose unguarded), so exact mode equals greedy with the same guard.
    guard: float = 0.0
    # > 0: verify a tree of this many candidates per call (decoding/tree.py: several candidates
    # per position, the longest path that passes the rule is kept), k - 1 levels deep at most;
    # 0: the chain of k proposals
    tree: int = 0

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
        if self.tree:
            self._validate_tree()

    def _validate_tree(self) -> None:
        if not 2 <= self.tree <= MAX_TREE:
            raise ValueError(f"tree={self.tree}: a tree verifies 2..{MAX_TREE} candidates per call (0: the chain)")
        if self.k < 2:
            raise ValueError("a tree needs k >= 2 (its depth is at most k - 1)")
        if self.temperature > 0:
            raise ValueError("trees verify greedy choices: speculative sampling keeps its distribution with one "
                             "draft per position only (use sample:k=K without tree)")
        if self.min_block != 1:
            raise ValueError("min-block forces a chain's prefix; a tree has no single prefix to force")

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
        if self.tree:
            parts.append(f"tree={self.tree}")
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
        name, fields = _mode_fields(spec, head)
        given = _settings_given(spec, settings, fields)
        fields["k"] = _block_size(spec, head, name, given, k)
        if name == "exact-heads":
            fields["propose"] = "argmax"
        if "min-block" in given:
            fields["min_block"] = _whole(spec, "min-block", given["min-block"])
        if "tree" in given:
            fields["tree"] = _whole(spec, "tree", given["tree"])
        fields.update(_guidance_fields(spec, given, prior_weight, guard))
        fields.update(_sampling_fields(spec, name, given))
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


def default_prior_weight(model: ImageTransformerSR) -> float:
    """The guidance weight the apps start from: DEFAULT_PRIOR_WEIGHT where the model has the
    learned input prior, else 1 (the only weight such a model takes)."""
    return DEFAULT_PRIOR_WEIGHT if model.lr_prior is not None else 1.0


MODES = ("greedy", "exact", "approx", "sample")
# the apps' cell guard for greedy, exact and approximate mode (experiments/cell-guard/)
DEFAULT_GUARD = 32.0


def default_guard(mode: str) -> float:
    """The apps' cell guard for a mode (MODES): DEFAULT_GUARD where it was measured (greedy,
    exact, approx); sampling draws from the model's own distribution (0)."""
    return 0.0 if mode == "sample" else DEFAULT_GUARD
# the apps' input guidance (experiments/input-guidance/)
DEFAULT_PRIOR_WEIGHT = 2.0
# the apps' block size per mode: the fastest measured on the native engine, where a longer block's
# call costs more (experiments/recycled-proposals/, window-proposals/, speculative-sampling/)
DEFAULT_K = {"greedy": 1, "exact": 2, "approx": 4, "sample": 4}


def options_for(mode: str, k: int | None = None, eps: int = 2, temperature: float = 1.0, seed: int = 0,
                prior_weight: float | None = None, guard: float | None = None) -> DecodeOptions:
    """The user-facing modes (upscale's --mode and its flags, the demo, Upscaler.options), as
    decode-mode specs: greedy (k=1), exact (exact:k=K, identical to greedy), approx
    (eps-window=E:k=K: a token within E levels of greedy's choice is kept, the heads proposing the
    centre of their most probable window), sample (sample:k=K:T=T:seed=S; k > 1 by speculative
    sampling, with plain sampling's distribution); all at the given input-prior weight (w=G;
    None: DecodeOptions' default, 1) and cell guard (guard=L; None: DecodeOptions' default, 0,
    off). k None: the mode's DEFAULT_K."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    k = DEFAULT_K[mode] if k is None else k
    spec = {"greedy": "greedy", "exact": f"exact:k={k}", "approx": f"eps-window={eps}:k={k}",
            "sample": f"sample:k={k}:T={temperature}:seed={seed}"}[mode]
    return DecodeOptions.parse(spec, prior_weight=prior_weight, guard=guard)


def mode_options(mode: str, *, k: int | None = None, eps: int | None = None, temperature: float | None = None,
                 seed: int | None = None, prior_weight: float | None = None, guard: float | None = None,
                 model: ImageTransformerSR | None = None, flags: bool = False) -> DecodeOptions:
    """A user-facing mode's DecodeOptions, checked: the one place the batch command, the Python API,
    the demo and the HTTP API check their settings. A setting the mode does not read is refused,
    not dropped (the decode would not be what was asked); each setting is named as its front end
    spells it (flags: `--eps 3`, else `eps=3`). None takes the default: k the mode's DEFAULT_K,
    eps 2, temperature 1, seed 0, guard default_guard(mode), prior_weight the model's
    default_prior_weight (DEFAULT_PRIOR_WEIGHT without a model). With a model, its limits too."""
    def name(setting, value=None):  # "--eps 3" / "eps=3"; without a value "--k" / "k"
        called = f"--{setting.replace('_', '-')}" if flags else setting
        if value is None:
            return called
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        return f"{called} {shown}" if flags else f"{called}={shown}"

    def mode_named(m):
        return f"--mode {m}" if flags else f"mode {m!r}"

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    _check_mode_reads(mode, k, eps, temperature, seed, name, mode_named)
    _check_mode_values(k, eps, temperature, seed, prior_weight, guard, name, mode_named)
    if prior_weight is None:
        prior_weight = default_prior_weight(model) if model is not None else DEFAULT_PRIOR_WEIGHT
    opts = options_for(mode, k=k, eps=2 if eps is None else eps, temperature=1.0 if temperature is None else temperature,
                       seed=0 if seed is None else seed, prior_weight=prior_weight,
                       guard=default_guard(mode) if guard is None else guard)
    if model is not None:
        opts.check(model)
    return opts


def options_per_mode(modes, *, k, eps, temperature, seed, prior_weight, guard,
                     model: ImageTransformerSR | None = None) -> dict[str, DecodeOptions]:
    """Each mode's checked options from one page's settings, which hold every mode's at once (the
    demo, the HTTP API): a mode gets the settings it reads (k: all but greedy; eps: approx;
    temperature and seed: sample; guard: all but sample, which draws from the model unguarded)."""
    return {m: mode_options(m, k=None if m == "greedy" else k, eps=eps if m == "approx" else None,
                            temperature=temperature if m == "sample" else None,
                            seed=seed if m == "sample" else None, prior_weight=prior_weight,
                            guard=None if m == "sample" else guard, model=model) for m in modes}


def _check_mode_reads(mode, k, eps, temperature, seed, name, mode_named) -> None:
    """Refuse the settings a mode does not read."""
    if mode == "greedy" and k not in (None, 1):
        raise ValueError(f"{name('k', k)}: greedy decoding takes one token per call; {mode_named('exact')} gives "
                         f"the same output in blocks of up to {name('k')}")
    for setting, value, reader, what in (("eps", eps, "approx", "accepts proposals within eps levels"),
                                         ("temperature", temperature, "sample", "draws at a temperature"),
                                         ("seed", seed, "sample", "draws with a seed")):
        if value is not None and mode != reader:
            raise ValueError(f"{name(setting, value)}: only {mode_named(reader)} {what} "
                             f"({mode_named(mode)} does not read it)")


def _check_mode_values(k, eps, temperature, seed, prior_weight, guard, name, mode_named) -> None:
    """Refuse values out of range, in the front end's own words."""
    def finite_at_least(x, low):
        return isinstance(x, (int, float)) and math.isfinite(x) and x >= low

    if k is not None and k < 1:
        raise ValueError(f"{name('k', k)}: the block size must be >= 1")
    if eps is not None and not 0 <= eps <= 255:
        raise ValueError(f"{name('eps', eps)}: the tolerance must be in 0..255 intensity levels")
    if temperature is not None and not (finite_at_least(temperature, 0) and temperature > 0):
        raise ValueError(f"{name('temperature', temperature)}: must be a finite number above 0 "
                         f"(0 would be greedy decoding: {mode_named('greedy')})")
    if seed is not None and not (isinstance(seed, (int, np.integer)) and 0 <= seed < 2**32):
        raise ValueError(f"{name('seed', seed)}: must be a whole number in 0..{2**32 - 1}")
    if guard is not None and not finite_at_least(guard, 0):
        raise ValueError(f"{name('guard', guard)}: must be a number of intensity levels >= 0 (0: off)")
    if prior_weight is not None and not finite_at_least(prior_weight, 0):
        raise ValueError(f"{name('prior_weight', prior_weight)}: the input guidance must be a number >= 0 "
                         "(1: the model as trained)")
