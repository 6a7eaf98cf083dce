"""The blockwise heads and their priors: how the model proposes k tokens from one decoder state.

Blockwise heads (Stern et al. 2018): a feed-forward layer d -> groups*head_ff -> groups*d, each
group added to the decoder output and layer-normed, all sharing the model's 256-way output
projection. Head 1 (p1) predicts the next token; head j the token j-1 after it. `model.py` holds
the transformer that makes the decoder states; this module turns a state into the heads'
logits (`head_logits`) and a block's proposals (`draft_heads`, `draft_tree`).

Where this departs from the paper, and why:
- the head layer's second matrix is block lower-triangular ("nested heads"): group g reads only
  hidden chunks 1..g, so one checkpoint trained with K heads is exactly a k-head model for every
  k <= K, and k heads cost k^2/2 instead of K^2;
- head1="base" (default) makes p1 the untouched base logits, so a frozen base decodes exactly
  like the base; head1="layer" routes p1 through the head layer as the paper does;
- every head's logits get the model's input prior (lr_prior, `ImageTransformerSR.with_prior`) at
  its own target position;
- nbr_prior=True gives heads 2..K a learned log-prior over the offset of the intensity they
  predict from intensities already decoded (the nearest one of the same channel to its left, and
  the one above): the decoder state does not carry recent intensities in a form the one-layer
  heads can read. p1 never gets it, so a frozen base still decodes exactly like the base; zero in
  a fresh model;
- nbr_draft=True lets those priors read the block's own earlier proposals ("drafts"), so a
  block's proposals are made one head at a time: the left reference is always the pixel just
  left, decoded or proposed, and G and B get a third, the pixel's previous channel plus the left
  pixel's difference of those two channels. In training and in the exact-mode replay the drafts
  are the targets themselves: a head's proposal only counts when every one before it was accepted.

What each choice measured, and the designs not kept: experiments/heads/README.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from .data import CHANNELS, IMAGE_SIZE, SEQ_LEN, VOCAB

if TYPE_CHECKING:
    from .model import ImageTransformerSR, ModelConfig


def target_coords() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, col, channel) of each of the 3072 target positions, raster order."""
    t = torch.arange(SEQ_LEN)
    return t // (IMAGE_SIZE * CHANNELS), (t // CHANNELS) % IMAGE_SIZE, t % CHANNELS


def intensities_at(tokens: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """tokens (B, S) at positions q (B, ...), clamped into 0..S-1: a caller reading before the
    image or past what is decoded gets a value it masks out or overwrites."""
    return torch.gather(tokens, 1, q.clamp(0, tokens.shape[1] - 1).reshape(len(tokens), -1)).view_as(q)


def offset_log_prior(table: torch.Tensor, row: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """A learned log-prior over (intensity - a reference intensity), as the priors store it:
    table (..., 511) with entry o + 255 for offset o, row (B, ...) which of its rows (flattened
    over the leading dims), ref (B, ...) the reference -> (B, ..., 256), one score per intensity.
    Intensity v's score is entry v - ref + 255: a window of 256 consecutive entries."""
    n_rows = table.numel() // (2 * VOCAB - 1)
    start = VOCAB - 1 - ref  # where the window starts in the row
    if ref.numel() > n_rows * VOCAB:
        # more lookups than the table has windows (training: every position of a batch, 9 heads;
        # a full forward): copy out every window once and read whole windows as embedding rows.
        # Gathering 256 single entries per lookup built a 256x larger index, and was most of a
        # fine-tuning step (measured).
        windows = table.reshape(n_rows, 2 * VOCAB - 1).unfold(1, VOCAB, 1).reshape(n_rows * VOCAB, VOCAB)
        return F.embedding(row * VOCAB + start, windows)
    # fewer lookups (a decoding step): index a strided view of the windows, no copy (2-7x
    # faster than gathering 256 single entries per lookup, measured at 1-320 lookups)
    return table.reshape(n_rows, 2 * VOCAB - 1).unfold(1, VOCAB, 1)[row, start]


class BlockwiseHeads(nn.Module):
    """d -> G*head_ff -> G*d, group g residual + LayerNorm; W2 block lower-triangular (nested);
    plus heads 2..K's neighbour priors (nbr_prior)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        G, f, d = cfg.n_groups, cfg.head_ff, cfg.d_model
        self.G, self.f, self.d = G, f, d
        self.nbr_draft = cfg.nbr_draft
        self.up = nn.Linear(d, G * f)
        self.down = nn.Linear(G * f, G * d)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(G))
        rows = torch.arange(G).repeat_interleave(d)[:, None]
        cols = torch.arange(G).repeat_interleave(f)[None, :]
        self.register_buffer("tri_mask", (cols <= rows).float(), persistent=False)
        self.premasked = False  # set by ImageTransformerSR.for_inference
        # nbr_prior[j - 1, r, ch, o + 255]: head j+1's log-prior of intensity = reference r's + o
        # (r = 0: same channel to the left, 1: above, 2 with nbr_draft: the pixel's previous
        # channel + the left pixel's difference); here so the heads stage trains it
        n_refs = 3 if cfg.nbr_draft else 2
        self.nbr_prior = (nn.Parameter(torch.zeros(cfg.n_blockwise - 1, n_refs, CHANNELS, 2 * VOCAB - 1))
                          if cfg.nbr_prior else None)
        _, c, ch = target_coords()
        self.register_buffer("tgt_c", c, persistent=False)
        self.register_buffer("tgt_ch", ch, persistent=False)

    def forward(self, h, n_groups: int | None = None):
        """h: (..., d) -> (..., g, d) normalized states of the first g groups."""
        g = self.G if n_groups is None else n_groups
        W1, b1 = self.up.weight[: g * self.f], self.up.bias[: g * self.f]
        W2 = self.down.weight[: g * self.d, : g * self.f]
        if not self.premasked:
            W2 = W2 * self.tri_mask[: g * self.d, : g * self.f]
        b2 = self.down.bias[: g * self.d]
        pre = F.linear(h, W1, b1)
        z = F.linear(F.gelu(pre), W2, b2)
        z = z.view(*h.shape[:-1], g, self.d) + h.unsqueeze(-2)
        return self._norm(z, 0, g)

    def _norm(self, z, g0, g1):
        """Groups g0..g1-1's LayerNorms on z (..., g1 - g0, d), at once (as a LayerNorm each
        would: norm, then affine); per group, the slices' backward filled a zero tensor per group
        (measured)."""
        w = torch.stack([n.weight for n in self.norms[g0:g1]])
        b = torch.stack([n.bias for n in self.norms[g0:g1]])
        acc = torch.promote_types(z.dtype, torch.float32)  # bf16 in, float32 math, rounded once
        zn = F.layer_norm(z.to(acc), (self.d,), eps=self.norms[0].eps) * w.to(acc) + b.to(acc)
        return zn.to(z.dtype)  # as LayerNorm's own kernel rounds a bf16 result

    # --- the neighbour priors of heads 2..K

    def neighbour_prior(self, tokens: torch.Tensor, tpos: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """nbr_prior's logits (B, ..., g, 256) for head j (g,) (2..K, predicting p1's position +
        j - 1) at target positions tpos (B, ..., g), read from tokens (B, S): the intensities
        decoded so far. Without nbr_draft only positions before p1's are read (both references
        of a head's target lie there); with it, also the block's proposals before the head's
        target (`draft_heads` fills them in; in training and replay they are the targets). A
        reference outside the image (first column or row) adds nothing."""
        t = tpos.clamp(max=SEQ_LEN - 1)
        B = tokens.shape[0]

        def read(p):
            return torch.gather(tokens, 1, p.clamp(min=0).reshape(B, -1)).view_as(p)

        if self.nbr_draft:  # every head at once, by the helpers draft_heads calls per head
            fixed = self.draft_prior_fixed(read, tpos, j)
            return self.draft_prior(fixed, slice(None), read(t - 1), read(t - 3), read(t - 4))
        tab, ch, col = self.nbr_prior, self.tgt_ch[t], self.tgt_c[t]
        back = (j + 2) // 3  # pixels back to the nearest decoded same channel: ceil(j / 3)
        refs = ((read(t - 3 * back), col >= back), (read(t - 3 * IMAGE_SIZE), t >= 3 * IMAGE_SIZE))
        out = 0
        for r, (val, ok) in enumerate(refs):
            row = ((j - 2) * len(refs) + r) * CHANNELS + ch  # the table's row for (head, reference, channel)
            out = out + offset_log_prior(tab, row, val) * (ok & (tpos < SEQ_LEN)).unsqueeze(-1)
        return out

    def draft_prior_fixed(self, read, u, j):
        """nbr_draft's parts that do not depend on the block's proposals, for heads j (k-1,)
        with targets u (..., k-1): each head's table rows, which references exist, and the
        above reference's log-prior (decoded: read once for all heads, with `read`)."""
        C = CHANNELS
        t = u.clamp(max=SEQ_LEN - 1)
        ch, col, inside = self.tgt_ch[t], self.tgt_c[t], u < SEQ_LEN
        rows0 = ((j - 2) * 3) * C + ch  # table rows of the left, above and G/B references
        ok = [((col >= 1) & inside).unsqueeze(-1), ((t >= 3 * IMAGE_SIZE) & inside).unsqueeze(-1),
              ((ch > 0) & (col >= 1) & inside).unsqueeze(-1)]
        above = offset_log_prior(self.nbr_prior, rows0 + C, read(t - 3 * IMAGE_SIZE)) * ok[1]
        return rows0, ok, above

    def draft_prior(self, fixed, a, prev, left, back4):
        """Head a+2's nbr_draft log-prior (..., 256) (a = slice(None): every head's) from
        `draft_prior_fixed` and the intensities 1, 3 and 4 before its target (decoded or
        proposed): the pixel just left, the one above, and for G and B the pixel's previous
        channel plus how the left pixel's two channels differ."""
        rows0, ok, above = fixed
        tab = self.nbr_prior
        grad = (prev + left - back4).clamp(0, VOCAB - 1)
        nbr = offset_log_prior(tab, rows0[..., a], left) * ok[0][..., a, :] + above[..., a, :]
        return nbr + offset_log_prior(tab, rows0[..., a] + 2 * CHANNELS, grad) * ok[2][..., a, :]


# ---------------------------------------------------------------- the heads' logits and proposals

def full_positions(h):
    """Positions 0..3071 for the states of a whole image's full forward; otherwise the
    caller must say which positions its states predict."""
    if h.dim() == 3 and h.shape[1] == SEQ_LEN:
        return torch.arange(SEQ_LEN, device=h.device).expand(h.shape[0], -1)
    return None


def _heads_before_nbr(model: ImageTransformerSR, h, k, src, pos, prior_weight=1.0):
    """The k heads' logits with lr_prior but without nbr_prior, and each head's position."""
    if model.cfg.head1 == "base":
        z = model.out_proj(h).unsqueeze(-2)
        if k > 1:
            z = torch.cat([z, model.out_proj(model.heads(h, k - 1))], dim=-2)
    else:
        z = model.out_proj(model.heads(h, k))
    pos = full_positions(h) if pos is None else pos
    if pos is not None:
        pos = pos.unsqueeze(-1) + torch.arange(k, device=h.device)
    return model.with_prior(z, src, pos, prior_weight), pos


def head_logits(model: ImageTransformerSR, h: torch.Tensor, k: int, src: torch.Tensor | None = None,
                pos: torch.Tensor | None = None, tokens: torch.Tensor | None = None,
                prior_weight: float = 1.0) -> torch.Tensor:
    """All k heads' logits from the decoder states h (B, ..., d) -> (B, ..., k, 256).
    pos (B, ...): the positions p1 predicts; head j predicts the token j-1 after it.
    tokens (B, S): the intensities decoded so far, at their positions (nbr_prior reads
    them; a whole image's targets in training)."""
    z, pos = _heads_before_nbr(model, h, k, src, pos, prior_weight)
    if k > 1 and model.cfg.nbr_prior:
        if tokens is None or pos is None:
            raise ValueError("this model has nbr_prior: heads 2..k need the decoded tokens and positions")
        nbr = model.heads.neighbour_prior(tokens, pos[..., 1:], torch.arange(2, k + 1, device=h.device))
        z = torch.cat([z[..., :1, :], z[..., 1:, :] + nbr.to(z.dtype)], dim=-2)
    return z


def draft_heads(model: ImageTransformerSR, h: torch.Tensor, k: int, src: torch.Tensor, pos: torch.Tensor,
                tokens: torch.Tensor, choose=None, prior_weight: float = 1.0,
                with_logits: bool = False, first: torch.Tensor | None = None, given: tuple | None = None):
    """A block's k proposals (b, k) from decoder states h (b, d) that predict positions pos
    (b,), given the decoded intensities tokens (b, S) (read before pos only). The first is
    p1's argmax, or `first` (b,) where given (speculative sampling's sampled token); heads
    2..k choose with `choose(logits, i)`: logits (b, 256) of the head at index i of 2..k (or
    (b, k-1, 256) and i = slice(None), all at once) -> tokens; default argmax.
    With nbr_draft a head's prior reads the proposals before it, so they are made one head
    at a time; each equals what `head_logits` gives when the tokens hold those proposals.
    with_logits: also returns the logits heads 2..k chose from, (b, k-1, 256) (the draft
    distributions speculative sampling verifies against; k=1: None). given: (tokens (b, k-1),
    counts (b,)): row i's first counts[i] proposals after the sure token are tokens[i, :counts[i]]
    instead of the heads' (recycled proposals, decoding.torch_engine._verify); the heads after them read them
    as they read their own."""
    choose = choose or (lambda z, i: z.argmax(-1))
    if given is not None:
        fixed, counts = given
        heads_choose = choose

        def choose(z, i):  # i: a head's index in 2..k (0 = head 2), or all of them at once
            c = heads_choose(z, i)
            at = torch.arange(k - 1, device=z.device)[i]
            return torch.where(at < (counts[:, None] if c.dim() == 2 else counts), fixed[:, i], c)
    props, logits = _draft(model, h, k, src, pos, tokens, choose, prior_weight, first)
    return (props, logits) if with_logits else props


def _draft(model, h, k, src, pos, tokens, choose, prior_weight, first=None):
    """draft_heads' proposals (b, k) and heads 2..k's logits (b, k-1, 256) (None for k=1)."""
    z, _ = _heads_before_nbr(model, h, k, src, pos, prior_weight)
    first = z[:, 0].argmax(-1) if first is None else first
    if k == 1:
        return first[:, None], None
    if not model.cfg.nbr_prior:
        return torch.cat([first[:, None], choose(z[:, 1:], slice(None))], 1), z[:, 1:]
    heads = model.heads
    j = torch.arange(2, k + 1, device=h.device)
    if not model.cfg.nbr_draft:  # every reference is decoded: all heads at once
        nbr = heads.neighbour_prior(tokens, pos[:, None] + j - 1, j)
        zh = z[:, 1:] + nbr.to(z.dtype)
        return torch.cat([first[:, None], choose(zh, slice(None))], 1), zh
    # nbr_draft's references, split into what is decoded (read once, every head at once) and
    # what the loop's own proposals supply; the same helpers neighbour_prior uses, so each
    # head's logits are bit for bit head_logits' (tested). Calling neighbour_prior once per
    # head cost ~35 small ops a head: more than a model call at batch 1.
    u = pos[:, None] + j - 1  # (b, k-1) the heads' targets

    def decoded(p):  # intensities at positions p (b, k-1) before pos (others are overwritten)
        return intensities_at(tokens, p)

    left_dec, back4_dec = decoded(u - 3), decoded(u - 4)
    fixed = heads.draft_prior_fixed(decoded, u, j)
    props, zs = [first], []
    for i in range(1, k):  # head i+1, target pos + i: proposals made so far are props[0..i-1]
        left = props[i - 3] if i >= 3 else left_dec[:, i - 1]
        back4 = props[i - 4] if i >= 4 else back4_dec[:, i - 1]
        nbr = heads.draft_prior(fixed, i - 1, props[i - 1], left, back4)
        zs.append(z[:, i] + nbr.to(z.dtype))
        props.append(choose(zs[-1], i - 1))
    return torch.stack(props, 1), torch.stack(zs, 1)


def draft_tree(model: ImageTransformerSR, h: torch.Tensor, src: torch.Tensor, pos: torch.Tensor,
               tokens: torch.Tensor, levels, first: torch.Tensor, prior_weight: float = 1.0,
               score=None, given: tuple | None = None) -> torch.Tensor:
    """A tree's node tokens (b, N) from decoder states h (b, d) that predict positions pos (b,),
    given the decoded intensities tokens (b, S) (read before pos only). Node 0, the root, is
    `first` (b,); levels[d - 1] = (nodes, their parents, their ranks, the largest rank + 1) says
    which nodes are at depth d (parents first): node i there is the rank[i]-th best value of head
    d+1 given the tokens on its path (with nbr_draft the prior reads the path as `draft_heads`
    reads a block's proposals, so a chain of rank-0 nodes is draft_heads' block). Shapes depend on
    the tree only, never on the values: no host synchronisation. score(logits (b, m, 256)) ->
    what candidates are ranked by (default the logits). given: (tokens (b, D), counts (b,), spine)
    puts an image's first counts[i] tokens on the rank-0 path (spine[d]: its node at depth d) in
    place of the heads' top choices (exact mode's recycled proposals, tree.recycled)."""
    D = len(levels)
    N = 1 + sum(len(nodes) for nodes, *_ in levels)
    z, _ = _heads_before_nbr(model, h, D + 1, src, pos, prior_weight)  # (b, D+1, 256)
    b = h.shape[0]
    tok = first.new_zeros(b, N)
    tok[:, 0] = first
    path = first.new_zeros(b, N, D + 1)  # the tokens on each node's path, by depth
    path[:, 0, 0] = first
    heads, cfg = model.heads, model.cfg
    j = torch.arange(2, D + 2, device=h.device)
    u = pos[:, None] + j - 1  # (b, D) the heads' targets
    if cfg.nbr_draft:
        left_dec, back4_dec = intensities_at(tokens, u - 3), intensities_at(tokens, u - 4)
        fixed = heads.draft_prior_fixed(lambda p: intensities_at(tokens, p), u[:, None], j)  # (b, 1, D, ...)
    elif cfg.nbr_prior:
        nbr_all = heads.neighbour_prior(tokens, u, j)  # every reference decoded: (b, D, 256)
    for d, (nodes, par, rank, width) in enumerate(levels, start=1):
        m = len(nodes)
        zd = z[:, d, None].expand(b, m, -1)
        if cfg.nbr_draft:
            left = path[:, par, d - 3] if d >= 3 else left_dec[:, d - 1, None].expand(b, m)
            back4 = path[:, par, d - 4] if d >= 4 else back4_dec[:, d - 1, None].expand(b, m)
            zd = zd + heads.draft_prior(fixed, d - 1, path[:, par, d - 1], left, back4).to(z.dtype)
        elif cfg.nbr_prior:
            zd = zd + nbr_all[:, d - 1, None].to(z.dtype)
        cand = (zd if score is None else score(zd)).topk(width, dim=-1).indices  # (b, m, width)
        tok[:, nodes] = cand.gather(-1, rank[None, :, None].expand(b, -1, 1))[..., 0]
        if given is not None and given[2][d] >= 0:
            s = given[2][d]
            tok[:, s] = torch.where(given[1] >= d, given[0][:, d - 1], tok[:, s])
        path[:, nodes] = path[:, par]
        path[:, nodes, d] = tok[:, nodes]
    return tok
