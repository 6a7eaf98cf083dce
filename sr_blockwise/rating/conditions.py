"""Study conditions: a decode mode (the project's grammar) and the weights it runs on, or the real
photo; which weights a condition takes by default, and the comparisons between conditions."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .common import StudyError

if TYPE_CHECKING:  # imported where first needed: decoding brings torch
    from ..decoding import DecodeOptions

FROZEN, FINETUNED = "cpu-frozen", "cpu-finetuned"  # default weights: greedy on frozen, k>1 fine-tuned
# the paper's rows: every k>1 fine-tuned condition against frozen k=1 greedy, plus the real photo
DEFAULT_CONDITIONS = ["greedy", "exact:k=2,4,6,8,10", "eps=2:k=2,4,6,8,10", "real"]


@dataclass(frozen=True)
class Condition:
    spec: str  # decode mode (decoding.DecodeOptions.spec), or real / broken: photos, not decoded
    weights: str = ""  # weights label ("" for real / broken)
    # the spec parsed once (None for real / broken); it follows from spec, so it takes no part in
    # equality or hashing
    parsed: DecodeOptions | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.decoded:
            from ..decoding import DecodeOptions
            object.__setattr__(self, "parsed", DecodeOptions.parse(self.spec))

    @property
    def decoded(self) -> bool:
        return self.spec not in ("real", "broken")

    def options(self) -> DecodeOptions | None:
        return self.parsed

    @property
    def name(self) -> str:
        return f"{self.spec}@{self.weights}" if self.decoded else self.spec

    @property
    def rule(self) -> str:
        """greedy | exact | eps | topk | oracle | sample | real | broken: how the image is made."""
        if not self.decoded:
            return self.spec
        o = self.parsed
        return "sample" if o.temperature > 0 else "greedy" if o.mode == "greedy" else o.rule

    @property
    def mode(self) -> str:
        """The spec's MODE (DecodeOptions.mode): greedy, exact, eps=E, sample, ... (Table 3's columns)."""
        return self.parsed.mode if self.decoded else self.spec

    @property
    def k(self) -> int:
        return self.parsed.k if self.decoded else 1

    @property
    def eps(self) -> int:
        return self.parsed.eps if self.decoded else 0

    @property
    def prior_weight(self) -> float:
        return self.parsed.prior_weight if self.decoded else 1.0

    @property
    def guard(self) -> float:
        return self.parsed.guard if self.decoded else 0.0

    @property
    def temperature(self) -> float:
        return self.parsed.temperature if self.decoded else 0.0

    @classmethod
    def from_name(cls, name: str) -> "Condition":
        (c,), _ = parse_conditions([name])
        return c


def weights_label(ref: str) -> str:
    """Short stable name for weights: the name itself, or a file's stem."""
    p = Path(ref)
    if "/" in ref or p.suffix in (".json", ".safetensors", ".pt"):
        return p.stem
    return ref


def _expand_k(mode: str) -> list[str]:
    """'exact:k=2,4,6' -> ['exact:k=2', 'exact:k=4', 'exact:k=6'] (a study's list of block sizes)."""
    parts = mode.split(":")
    at = [i for i, p in enumerate(parts) if p.strip().lower().startswith("k=") and "," in p]
    if not at:
        return [mode]
    i = at[0]
    return [":".join(parts[:i] + [f"k={k.strip()}"] + parts[i + 1:]) for k in parts[i][2:].split(",") if k.strip()]


def parse_conditions(specs, frozen: str = FROZEN, finetuned: str = FINETUNED) -> tuple[list[Condition], dict]:
    """Condition specs -> (conditions, {weights label: weights name or path}).
    A condition is a decode mode in the project's grammar (decoding.DecodeOptions.parse:
    greedy, exact:k=K, eps=E:k=K, sample:k=K:T=T, ... with :w=G for input guidance), K may be a
    list (exact:k=2,4,6), then @W for the weights; or `real`, the photo. Without @W, greedy uses
    the frozen weights and every other mode the fine-tuned ones (the paper's comparison; sampling
    at k=1 and k>1 on the same weights, so both have the same distribution)."""
    from ..decoding import DecodeOptions
    conds, refs = [], {}
    for spec in specs:
        spec = spec.strip()
        if spec == "real":
            conds.append(Condition("real"))
            continue
        mode, at, ref = spec.partition("@")
        if at and not ref.strip():
            raise StudyError(f"condition {spec!r}: say the weights after @ (a name in weights/ or a .json path)")
        for one in _expand_k(mode):
            try:
                opts = DecodeOptions.parse(one)
            except ValueError as e:
                photo = "; or real, the photo" if str(e).startswith("unknown decode mode") else ""
                raise StudyError(f"condition {spec!r}: {e}{photo}") from None
            if not 1 <= opts.k <= 16:
                raise StudyError(f"condition {spec!r}: k={opts.k} is outside 1..16")
            w = ref.strip() or (frozen if opts.mode == "greedy" else finetuned)
            label = weights_label(w)
            if refs.get(label, w) != w:
                raise StudyError(f"two different weights are both labelled {label!r}: {refs[label]} and {w}")
            refs[label] = w
            conds.append(Condition(opts.spec, label))
    names = [c.name for c in conds]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise StudyError(f"condition listed twice: {', '.join(dup)}")
    if not conds:
        raise StudyError("no conditions given")
    return conds, refs


def sample_seeds(study_seed: int, name: str, n: int) -> list[int]:
    """decode's sampling seed for each of a sampled condition's n faces: from the study seed, the
    condition's name and the face, so every condition draws its own, independent samples (two
    samplers with the same distribution compared on shared noise would not be a fair 50% test)."""
    return [int.from_bytes(hashlib.sha256(f"{study_seed}:{name}:{j}".encode()).digest()[:8], "little") >> 1
            for j in range(n)]


def parse_comparisons(compare, conds: list[Condition], frozen=FROZEN, finetuned=FINETUNED) -> list[tuple[str, str]]:
    """compare: "baseline" (every condition against the first; the real photo against it too),
    "all" (every pair), or a list of "A vs B" (preference is reported for A)."""
    names = [c.name for c in conds]
    model = [c.name for c in conds if c.decoded]
    if compare in (None, "baseline", ["baseline"]):
        if not model:
            raise StudyError("the study needs at least one decoded condition")
        base = model[0]
        pairs = [(n, base) for n in model[1:]]
        if "real" in names:
            pairs.append((base, "real"))  # preference for the model output = raters fooled
    elif compare in ("all", ["all"]):
        pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
        pairs = [(b, a) if a == "real" else (a, b) for a, b in pairs]
    else:
        pairs = []
        for item in ([compare] if isinstance(compare, str) else compare):
            parts = item.split(" vs ")
            if len(parts) != 2:
                raise StudyError(f"comparison {item!r}: write it as 'A vs B'")
            side = []
            for spec in parts:
                (c,), _ = parse_conditions([spec], frozen, finetuned)
                if c.name not in names:
                    raise StudyError(f"comparison {item!r}: {c.name} is not one of the conditions ({', '.join(names)})")
                side.append(c.name)
            pairs.append(tuple(side))
    seen = set()
    for a, b in pairs:
        if a == b:
            raise StudyError(f"comparison of {a} with itself")
        if frozenset((a, b)) in seen:
            raise StudyError(f"comparison {a} vs {b} listed twice")
        seen.add(frozenset((a, b)))
    if not pairs:
        raise StudyError("no comparisons: give at least two conditions")
    return pairs
