"""The PyTorch engine: decode as named stages (start, verify, commit, propose) over the model's KV
cache. It runs anywhere PyTorch does (GPUs, head1='layer' models, machines without a compiler)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ..data import check_input, from_tokens, to_tokens
from ..model import SEQ_LEN, ImageTransformerSR
from .guard import cell_guard
from .options import DecodeOptions
from .results import DecodeResult, DecodeStats
from .rules import accepted_length, window_centre
from .sampling import residual_logits, sampling_noise, speculative_accepted_length

@torch.no_grad()
def decode_torch(model: ImageTransformerSR, lr, opts: DecodeOptions, progress, progress_every: int, proposer,
                 seeds) -> DecodeResult:
    """decode on the torch engine: start (prefill and the first proposals), then a call per block:
    verify the proposals, commit what the rule accepts, propose the next block from the last state."""
    s = _start(model, lr, opts, seeds, proposer)
    while len(s.rows):
        take_last_tokens(s)
        if not len(s.rows):
            break
        h, n, verified = _verify(model, s, opts)
        h_next, verified = commit(s, h, n, verified)
        if len(s.rows):
            s.props, s.qlog = _propose(model, h_next, s.k, opts, opts.prior_weight, s.gen, s.t[s.rows], s.rows,
                                       s.src, s.out, proposer, verified, s.recycled)
        if progress is not None and s.n_calls % progress_every == 0:
            progress(s.out[:, :SEQ_LEN].cpu().numpy(), s.t.cpu().numpy(), s.bmap[:, :SEQ_LEN].cpu().numpy(),
                     s.n_calls)
    return finish(s, progress)


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
    gen: tuple | None  # sampling_noise's tables when sampling
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
    """Prefill, and propose every image's first block."""
    s, h = prefill(model, lr, opts, seeds, opts.k)
    s.props, s.qlog = _propose(model, h, s.k, opts, opts.prior_weight, s.gen, s.t, s.rows, s.src, s.out, proposer)
    return s


def prefill(model, lr, opts: DecodeOptions, seeds, k: int) -> tuple[_Batch, torch.Tensor]:
    """Encode the inputs and run the first (prefix-free) call: -> (the batch, accepting blocks of
    up to k tokens; the decoder states (B, d) that predict every image's first token)."""
    dev = next(model.parameters()).device
    src = torch.from_numpy(to_tokens(lr)).to(dev)
    B = src.shape[0]
    t0 = time.perf_counter()
    cache = model.new_cache(src, max_extra=max(16, k))
    speculative = opts.temperature > 0 and k > 1
    s = _Batch(src, cache, k, speculative,
               gen=sampling_noise(B, opts, dev, seeds, speculative) if opts.temperature > 0 else None,
               out=torch.zeros(B, SEQ_LEN + k, dtype=torch.long, device=dev),
               bmap=torch.zeros(B, SEQ_LEN + k, dtype=torch.long, device=dev),
               t=torch.zeros(B, dtype=torch.long, device=dev), hist=torch.zeros(B, k, dtype=torch.long),
               calls=torch.ones(B, dtype=torch.long), finish=np.zeros(B), t0=t0)
    h = model.step(cache, torch.full((B, 1), -1, dtype=torch.long, device=dev),
                   torch.zeros(B, dtype=torch.long, device=dev))[:, 0]
    s.rows = torch.arange(B, device=dev)
    return s, h


def take_last_tokens(s: _Batch) -> None:
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


def commit(s: _Batch, h, n, verified):
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


def finish(s: _Batch, progress) -> DecodeResult:
    seconds = time.perf_counter() - s.t0
    tokens = s.out[:, :SEQ_LEN].clamp(0, 255).cpu().numpy()
    stats = [DecodeStats(int(s.calls[i]), s.hist[i].tolist(), float(s.finish[i])) for i in range(len(tokens))]
    if progress is not None:
        progress(tokens, s.t.cpu().numpy(), s.bmap[:, :SEQ_LEN].cpu().numpy(), s.n_calls)
    return DecodeResult(from_tokens(tokens), stats, s.bmap[:, :SEQ_LEN].cpu().numpy().astype(np.uint8),
                        seconds, s.n_calls, {"engine": "torch"})


def _propose(model, h, k, opts, w, gen, t, rows, src, out, proposer=None, verified=None, recycled=None):
    """k proposals from the decoder state h (b, d) that predicts position t (b,) of images `rows`
    of the batch's input src, whose confirmed tokens are out[rows, :t], at guidance weight w
    (opts.prior_weight, as decode passes it). The first is always
    p1's own choice, with the cell guard where opts has it (so it needs no verification); the others come from the heads, or from
    `proposer(t, rows, k)` -> (b, k-1) tokens when one is given (e.g. a draft model).
    Sampling (gen: sampling_noise's tables): the first token is p1's sample; heads 2..k then
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
