"""Sampling: per-image noise tables, and speculative sampling's acceptance and residual."""
from __future__ import annotations

import torch

from ..model import SEQ_LEN

# image i of a batch draws with seed * SEED_STRIDE + i: an image decoded alone with seed s draws
# with s * SEED_STRIDE, which callers pass as `seeds` to give it that sample in any batch
SEED_STRIDE = 1_000_003


def sampling_noise(B, opts, dev, seeds=None, speculative=False):
    """Per-image noise from a per-image generator, by position, so that an image's sample does not
    depend on its batch (with `seeds`, one per image; by default image i gets seed * SEED_STRIDE + i):
    (Gumbel noise for each position's sure token (B, 3072, 256), and for speculative sampling the
    acceptance uniforms (B, 3072) and the drafts' Gumbel noise (B, 3072, 256)). A position's
    noise is used once for what is kept there: a draft redrawn after an earlier rejection reuses
    it, but the discarded draft decided nothing that was kept."""
    first = torch.empty(B, SEQ_LEN, 256)
    accept, draft = (torch.empty(B, SEQ_LEN), torch.empty(B, SEQ_LEN, 256)) if speculative else (None, None)
    for i in range(B):
        g = torch.Generator().manual_seed(int(seeds[i]) if seeds is not None else opts.seed * SEED_STRIDE + i)
        first[i] = gumbel(g, (SEQ_LEN, 256))  # drawn first: k=1 samples as before speculative sampling
        if speculative:
            accept[i] = torch.rand(SEQ_LEN, generator=g)
            draft[i] = gumbel(g, (SEQ_LEN, 256))
    return tuple(x.to(dev) if x is not None else None for x in (first, accept, draft))


def gumbel(g, shape):
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
