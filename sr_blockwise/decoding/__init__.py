"""Greedy, blockwise parallel and sampled decoding of a batch of 8x8 inputs, KV cached.

Blockwise (Stern et al. 2018), merged predict+verify: from the confirmed prefix of t tokens we
hold k proposals y_t..y_{t+k-1} (the first is p1's own argmax, so it is certain). One model call
feeds all k at positions t+1..t+k; p1's argmax at each position verifies the next proposal; the
longest accepted prefix is kept, and the heads read at the last accepted position give the next
block's proposals. About 3072/k + 1 calls instead of 3072. k=1 is plain greedy decoding. With a
tree (`tree.py`) one call verifies several candidates per position and keeps the longest path
that passes.

Sampling (temperature > 0) with k > 1 is speculative sampling (Leviathan et al. 2023, Chen et al.
2023) on the same merged loop: the first token is p1's sample, the heads sample their drafts, and
a draft is kept with probability min(1, p(x)/q(x)); at the first rejection the token is drawn
from max(0, p - q) instead, and becomes the next block's first token. The samples then have
exactly the distribution of plain sampling (one token per call), in fewer calls.

Each image keeps its own position and accepted length: finished images leave the batch, and
every call has the same shape (k tokens per image), so an image's output does not depend on the
batch it was decoded in.

The package, one idea a module:
- options.py: DecodeOptions and the decode-mode grammar; the apps' modes and defaults;
- rules.py: the acceptance rules; guard.py: the cell guard; sampling.py: noise and speculative
  sampling's rule;
- torch_engine.py: decode as named stages (`_start`, then per call `_verify`, `commit`,
  `_propose`) on PyTorch; engine.py + engine.cpp: the native engine, the same stages in one
  native call per step; static.py: a fixed-shape step for accelerators (CUDA graphs); tree.py:
  tree-shaped proposals and their verification;
- replay.py: exact-heads block sizes replayed over greedy outputs, without decoding.
"""
from __future__ import annotations

import torch

from ..data import check_input
from ..model import ImageTransformerSR
from . import engine as native
from .guard import GUARD_SLOPE, cell_guard  # noqa: F401 (the package's API, as below)
from .options import (DEFAULT_GUARD, DEFAULT_K, DEFAULT_PRIOR_WEIGHT, MODES, PROPOSALS, RULES,  # noqa: F401
                      SPEC_HELP, SPEC_MODES, DecodeOptions, check_seed, default_guard, default_prior_weight,
                      mode_options, options_for, options_per_mode)
from .replay import exact_block_stats  # noqa: F401
from .results import DecodeResult, DecodeStats, pooled_block_hist  # noqa: F401
from .rules import ACCEPT, accepted_length, window_centre  # noqa: F401
from .sampling import residual_logits, sampling_noise, speculative_accepted_length  # noqa: F401
from .torch_engine import decode_torch, greedy_uncached  # noqa: F401
from .static import decode_static
from .tree import decode_tree
from .engine import ENGINES, engine_for, not_native  # noqa: F401


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
    which = engine_for(model, opts, engine)
    if (opts.tree or which == "static") and proposer is not None:
        raise ValueError("trees and the static engine propose with the heads: not with a proposer")
    if which == "static":
        return decode_static(model, lr, opts, progress, progress_every)
    if opts.tree:
        return decode_tree(model, lr, opts, progress, progress_every)
    if which == "native":
        return native.decode_native(model, lr, opts, progress, progress_every, proposer, seeds)
    return decode_torch(model, lr, opts, progress, progress_every, proposer, seeds)


def greedy(model, lr, **kw) -> DecodeResult:
    return decode(model, lr, DecodeOptions(k=1), **kw)

