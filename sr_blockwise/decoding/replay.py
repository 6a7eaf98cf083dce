"""Exact-heads mode's block sizes replayed over greedy outputs, without decoding."""
from __future__ import annotations

import numpy as np
import torch

from ..data import check_input, to_tokens
from ..model import SEQ_LEN, ImageTransformerSR
from . import engine as native
from .options import DecodeOptions
from .results import DecodeStats

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
    if native.engine_for(model, DecodeOptions(prior_weight=prior_weight), engine) == "native":
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
