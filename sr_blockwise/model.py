"""The Image Transformer for 8x8 -> 32x32 super-resolution, with blockwise heads.

Encoder: the 8x8x3 input as 192 channel tokens, full self-attention.
Decoder: the 3072 target intensities in raster order (row, column, channel), shifted right,
local 1D self-attention (query blocks of `block_len`, each sees itself causally plus the whole
previous block), cross-attention to the encoder, a 256-way output per intensity.
Blockwise heads (Stern et al. 2018): a feed-forward layer d -> groups*head_ff -> groups*d, each
group added to the decoder output and layer-normed, all sharing the 256-way output projection.

Deviations from the paper, each for a reason written next to it:
- pre-norm instead of post-norm (trains stably in the short runs a 2-core CPU allows);
- the head layer's second matrix is block lower-triangular ("nested heads"): group g only reads
  hidden chunks 1..g, so one checkpoint trained with K heads is exactly a k-head model for every
  k <= K, and the cost of k heads grows as k^2/2 instead of K^2;
- head1="base" (default) makes p1 the untouched base logits, so a frozen base decodes exactly
  like the base; head1="layer" routes p1 through the head layer as the paper does;
- lr_skip=True (the cpu preset) adds to each decoder input an embedding of the low-resolution
  intensity that covers the predicted position. The paper's model finds it through
  cross-attention alone, which takes far more training than 2 CPU cores give: after 2 hours our
  model without it still ignored most of the input. Zero-initialized, so a model trained without
  it warm-starts unchanged;
- lr_prior=True (the cpu preset) adds to every head's logits a learned log-prior over the offset
  of the predicted intensity from the input cell's intensity. Without it our 2-hour model's
  greedy decode ignored the input and collapsed to flat dark images; with it the output can
  never drift far from the input's colours. Zero in a fresh model, so old weights load and
  compute unchanged; `train` then sets a zero prior from the data's offset histogram before the
  first step (not in the frozen-base heads stage), which does change p1 from step 0;
- nbr_prior=True (the cpu preset) gives heads 2..K a learned log-prior over the offset of the
  intensity they predict from two intensities already decoded: the nearest one of the same
  channel to its left in the row, and the one above. Why: on cpu-frozen's greedy outputs, heads 2
  and 3 landed within 2 levels of greedy's token less often (45%) than simply copying the
  pixel to the left (51%): the decoder state does not carry recent intensities in a form the
  one-layer heads can read. Fitting just these tables to 48 training faces, the rest frozen,
  raised heads 2..6 from 37-50% to 54-58% within 2 levels (greedy outputs of 8 validation faces,
  a one-off measurement, experiments/heads/). p1 never gets it, so a frozen base still decodes exactly
  like the base. Zero in a fresh model: old weights load and compute unchanged;
- nbr_draft=True (the cpu preset) lets those priors read the block's own
  earlier proposals ("drafts"), so decoding makes a block's proposals one head at a time
  (`draft_heads`): the left reference is always the pixel just left, decoded or proposed, and
  G and B get a third, the pixel's previous channel plus the left pixel's difference of those two
  channels. Why: the head that most often ends a block is head 2 (accepted on 36% of eps=2 steps
  with the weights before nbr_draft), which had to guess the G after an R it could not see, though
  that R is p1's own sure proposal. On those weights' greedy outputs (32 test faces) the G/B
  reference lands within 2 levels of the token 52% of the time against 36% for the pixel to
  the left. In training and in the exact-mode replay the drafts are the targets themselves:
  a head's proposal only counts when every proposal before it was accepted;
- draft_emb=True (an option in no preset, measured and not shipped: see below) lets the heads'
  hidden layer, not only their additive priors, read the block: each group's pre-activation gets a learned projection of two
  embedded intensities, the one just before its target and the same channel one pixel left,
  decoded or proposed (sequentially dependent draft heads, as in Hydra, Ankner et al. 2024). Why:
  the priors add a fixed log-prior per offset from a reference, whatever the decoder state; the
  hidden layer can weigh a reference by context (an edge, hair, a flat cheek). Zero-projected at
  first, so older weights warm-start unchanged. Measured (experiments/heads/draft-emb-32/): blocks
  grew about 1-6% over the same heads without it; drafting one head at a time through the hidden
  layer adds ~2% to a call at batch 32 but about half a model call at batch 1 (the demo's), and
  its approximate output was a little worse perceptually, so the shipped weights do not use it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

IMAGE_SIZE = 32
INPUT_SIZE = 8
CHANNELS = 3
SEQ_LEN = IMAGE_SIZE * IMAGE_SIZE * CHANNELS  # 3072 target tokens
SRC_LEN = INPUT_SIZE * INPUT_SIZE * CHANNELS  # 192 source tokens
VOCAB = 256


@dataclass
class ModelConfig:
    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 512
    n_enc_layers: int = 2
    n_dec_layers: int = 4
    block_len: int = 128  # local attention query block (the paper's query_shape)
    n_blockwise: int = 10  # K: how many tokens the heads propose (1 = plain base model)
    head_ff: int = 128  # hidden width per head group in the blockwise layer
    head1: str = "base"  # "base": p1 = base logits; "layer": p1 also goes through the head layer
    dropout: float = 0.0
    # add to each decoder input an embedding of the 8x8 input's intensity under the position being
    # predicted (its 4x4 cell, same channel); see the module docstring
    lr_skip: bool = False
    # add to every output's logits a learned prior over (intensity - the input cell's intensity),
    # per channel: 3 x 511 numbers, initialized from the training data (train.init_lr_prior)
    lr_prior: bool = False
    # add to heads 2..K's logits learned priors over (intensity - an intensity already decoded):
    # the nearest of the same channel to the left, and the one above; (K-1) x 2 x 3 x 511 numbers
    nbr_prior: bool = False
    # nbr_prior reads the block's own earlier proposals too ("drafts"): the left reference is
    # always the pixel just left, decoded or proposed, and G and B get a third reference, the
    # pixel's previous channel plus the left pixel's difference of the two; (K-1) x 3 x 3 x 511
    nbr_draft: bool = False
    # the heads' hidden layer reads two intensities of the block too, as learned embeddings: the
    # one just before the head's target and the same channel one pixel left (decoded or proposed);
    # 2 x 769 x d embeddings + a d -> head_ff projection per group, zero at first
    draft_emb: bool = False

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if SEQ_LEN % self.block_len:
            raise ValueError(f"block_len={self.block_len} must divide {SEQ_LEN}")
        if not 1 <= self.n_blockwise <= 16:
            raise ValueError(f"n_blockwise must be in 1..16, got {self.n_blockwise}")
        if self.head1 not in ("base", "layer"):
            raise ValueError(f"head1 must be 'base' or 'layer', got {self.head1!r}")
        if self.nbr_draft and not self.nbr_prior:
            raise ValueError("nbr_draft extends nbr_prior: it needs nbr_prior=True")
        if self.draft_emb and self.head1 != "base":
            raise ValueError("draft_emb needs head1='base' (p1 must not read the block's drafts)")

    @property
    def n_groups(self) -> int:
        """Head groups in the blockwise layer (head 1 needs none when it is the base)."""
        return self.n_blockwise - 1 if self.head1 == "base" else self.n_blockwise

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown model config fields: {sorted(unknown)}")
        return cls(**d)


PRESETS = {
    # a few seconds to build; for tests
    "tiny": ModelConfig(d_model=32, n_heads=2, d_ff=64, n_enc_layers=1, n_dec_layers=2,
                        block_len=64, n_blockwise=10, head_ff=16, lr_skip=True,
                        lr_prior=True, nbr_prior=True, nbr_draft=True),
    # the shipped model: 3.3M parameters, ~4 training images/s on 2 Zen 5 cores in bf16, about
    # one epoch of the training split per 2 hours; a 1-token decoding call ~2.3 ms at batch 1
    # (bench-decode), so greedy decoding ~7 s per image alone, less per image in a batch
    "cpu": ModelConfig(lr_skip=True, lr_prior=True, nbr_prior=True, nbr_draft=True),
    # for one short run on the lent GPU (gpu/README.md): the cpu preset's features, 1.5x as wide
    # and 6 decoder layers; 7.25M parameters, so its compact checkpoint (14.8 MB) comes back in one file
    "gpu": ModelConfig(d_model=192, n_heads=4, d_ff=768, n_enc_layers=2, n_dec_layers=6,
                       lr_skip=True, lr_prior=True, nbr_prior=True, nbr_draft=True),
    # img2img_transformer_b3 from PAPER.md, for GPU users
    "paper": ModelConfig(d_model=512, n_heads=8, d_ff=2048, n_enc_layers=4, n_dec_layers=8,
                         block_len=128, n_blockwise=10, head_ff=2048, head1="layer", dropout=0.1),
}


def preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return ModelConfig(**{**PRESETS[name].to_dict(), **overrides})


# ---------------------------------------------------------------- positions of the target tokens

def target_coords() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, col, channel) of each of the 3072 target positions, raster order."""
    t = torch.arange(SEQ_LEN)
    return t // (IMAGE_SIZE * CHANNELS), (t // CHANNELS) % IMAGE_SIZE, t % CHANNELS


def local_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, block_len: int) -> torch.Tensor:
    """True where query position q may attend key position k under block-local causal attention:
    k <= q and k lies in q's block or the block before it."""
    q = q_pos.unsqueeze(-1)
    k = k_pos.unsqueeze(-2)
    return (k <= q) & (k >= (q // block_len - 1) * block_len)


# ---------------------------------------------------------------- layers

def attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask_t: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention in float64, for decoding: q (B, H, n, hd), k/v (B, H, S, hd), mask_t
    (B, 1, S, n) True where query j may read key s (None: everywhere) -> (B, H, n, hd) float64.
    Why float64: a bf16 SDPA call rounds a query's result differently depending on how many
    queries share the call (measured: 1 query vs n), which moves a decoder state by 1 bf16 ulp
    now and then and flips near-tied argmaxes between a greedy call and a k-token verify call.
    In float64 the products of bf16 values are exact, masked keys add exact zeros, and the sums'
    call-dependent rounding (~1e-16 relative) does not change the bf16 value the result is
    rounded back to. Scores are computed transposed, k @ q^T, so that only the small q and P
    are copied into matmul layout, never the keys."""
    s_t = (k.double() @ q.double().transpose(-1, -2).contiguous()) * q.shape[-1] ** -0.5
    if mask_t is not None:
        s_t = s_t.masked_fill(~mask_t, float("-inf"))
    return torch.softmax(s_t, dim=-2).transpose(-1, -2).contiguous() @ v.double()


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


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.cross = cross
        if cross:
            self.q = nn.Linear(d, d)
            self.kv = nn.Linear(d, 2 * d)
        else:
            self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.dropout = cfg.dropout

    def split(self, x):  # (B, T, d) -> (B, H, T, hd)
        B, T, d = x.shape
        return x.view(B, T, self.n_heads, d // self.n_heads).transpose(1, 2)

    def merge(self, x):  # (B, H, T, hd) -> (B, T, d)
        B, H, T, hd = x.shape
        return x.transpose(1, 2).reshape(B, T, H * hd)

    def attend(self, q, k, v, mask=None):
        p = self.dropout if self.training else 0.0
        return self.merge(F.scaled_dot_product_attention(self.split(q), self.split(k), self.split(v),
                                                         attn_mask=mask, dropout_p=p))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg)

    def forward(self, x):
        q, k, v = self.attn.qkv(self.ln1(x)).chunk(3, dim=-1)
        x = x + self.attn.out(self.attn.attend(q, k, v))
        return x + self.ff(self.ln2(x))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.down(F.gelu(self.up(x))))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.block_len = cfg.block_len
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.self_attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.cross_attn = Attention(cfg, cross=True)
        self.ln3 = nn.LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg)

    def local_self_attention(self, x):
        """Training / full forward: attention computed block by block. Each block of L queries
        attends to 2L keys (previous block + itself) instead of the whole sequence."""
        B, T, d = x.shape
        L = self.block_len
        nb = T // L
        q, k, v = self.self_attn.qkv(x).chunk(3, dim=-1)
        H, hd = self.self_attn.n_heads, d // self.self_attn.n_heads

        def blocks(t):  # (B, T, d) -> (B*nb, H, L, hd)
            return t.view(B, nb, L, H, hd).permute(0, 1, 3, 2, 4).reshape(B * nb, H, L, hd)

        qb, kb, vb = blocks(q), blocks(k), blocks(v)
        # keys of block i = [block i-1, block i]; block 0's "previous block" is masked out
        kb = kb.view(B, nb, H, L, hd)
        vb = vb.view(B, nb, H, L, hd)
        k_prev = torch.cat([torch.zeros_like(kb[:, :1]), kb[:, :-1]], dim=1)
        v_prev = torch.cat([torch.zeros_like(vb[:, :1]), vb[:, :-1]], dim=1)
        k2 = torch.cat([k_prev, kb], dim=3).view(B * nb, H, 2 * L, hd)
        v2 = torch.cat([v_prev, vb], dim=3).view(B * nb, H, 2 * L, hd)
        # Written out rather than F.scaled_dot_product_attention: with a mask, SDPA on CPU falls
        # back to a slow kernel whose backward took 38% of a training step; these bf16 matmuls
        # plus an additive mask run one layer's forward + backward in about half the time.
        scores = (qb * hd ** -0.5) @ k2.transpose(-1, -2)  # (B*nb, H, L, 2L)
        bias = self._block_bias(nb, L, x.device, scores.dtype)  # (nb, 1, L, 2L)
        scores = (scores.view(B, nb, H, L, 2 * L) + bias).view(B * nb, H, L, 2 * L)
        attn = F.dropout(scores.softmax(dim=-1), p=self.self_attn.dropout, training=self.training)
        o = attn @ v2
        o = o.view(B, nb, H, L, hd).permute(0, 1, 3, 2, 4).reshape(B, T, d)
        return self.self_attn.out(o)

    @staticmethod
    def _block_bias(nb, L, device, dtype):
        """Additive mask, 0 where a query may look and -inf elsewhere: causal within the block,
        the whole previous block, and nothing before block 0."""
        i = torch.arange(L, device=device)[:, None]
        j = torch.arange(2 * L, device=device)[None, :]
        allowed = (j <= i + L).expand(nb, L, 2 * L).clone()
        allowed[0, :, :L] = False  # block 0 has no previous block
        bias = torch.zeros(nb, 1, L, 2 * L, device=device, dtype=dtype)
        return bias.masked_fill_(~allowed.unsqueeze(1), float("-inf"))

    def forward(self, x, enc_k, enc_v):
        x = x + self.local_self_attention(self.ln1(x))
        x = x + self.cross_attn.out(self.cross_attn.attend(self.cross_attn.q(self.ln2(x)), enc_k, enc_v))
        return x + self.ff(self.ln3(x))


class BlockwiseHeads(nn.Module):
    """d -> G*head_ff -> G*d, group g residual + LayerNorm; W2 block lower-triangular (nested)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        G, f, d = cfg.n_groups, cfg.head_ff, cfg.d_model
        self.G, self.f, self.d = G, f, d
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
        # draft_emb[r, value + 256 * channel]: reference r's embedding (r = 0: the intensity just
        # before the target, 1: the same channel one pixel left; index 768: none), read by each
        # group through its own projection draft_up. draft_up starts at zero (a warm start
        # computes unchanged); the embeddings start random (ImageTransformerSR, last, so that
        # every other weight is drawn as without them), or no gradient would reach either.
        self.draft_emb = nn.Parameter(torch.zeros(2, CHANNELS * VOCAB + 1, d)) if cfg.draft_emb else None
        self.draft_up = nn.Parameter(torch.zeros(G * f, d)) if cfg.draft_emb else None

    def forward(self, h, n_groups: int | None = None, draft=None):
        """h: (..., d) -> (..., g, d) normalized states of the first g groups. draft (..., g, d):
        each group's reference embeddings (draft_emb; `ImageTransformerSR.draft_refs`)."""
        g = self.G if n_groups is None else n_groups
        W1, b1 = self.up.weight[: g * self.f], self.up.bias[: g * self.f]
        W2 = self.down.weight[: g * self.d, : g * self.f]
        if not self.premasked:
            W2 = W2 * self.tri_mask[: g * self.d, : g * self.f]
        b2 = self.down.bias[: g * self.d]
        pre = F.linear(h, W1, b1)
        if (draft is None) != (self.draft_up is None):
            raise ValueError("draft must be given exactly when the heads have draft_emb")
        if draft is not None:
            up = self.draft_up[: g * self.f].view(g, self.f, self.d)
            pre = pre + torch.einsum("...gd,gfd->...gf", draft, up).flatten(-2)
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

    def group(self, h, pre, hidden: list, gi: int, draft):
        """Group gi's normalized state alone (..., d), for drafting one head at a time: pre
        (..., >= (gi+1)*f) the up-projection of h for all groups, hidden the earlier groups'
        activations (this group's is appended), draft (..., d) its reference embeddings."""
        f, d = self.f, self.d
        a = pre[..., gi * f:(gi + 1) * f] + F.linear(draft, self.draft_up[gi * f:(gi + 1) * f])
        hidden.append(F.gelu(a))
        # the nested matrix's row block gi reads hidden chunks 0..gi, where its mask is all ones
        z = F.linear(torch.cat(hidden, -1), self.down.weight[gi * d:(gi + 1) * d, :(gi + 1) * f],
                     self.down.bias[gi * d:(gi + 1) * d]) + h
        return self._norm(z.unsqueeze(-2), gi, gi + 1)[..., 0, :]


# ---------------------------------------------------------------- the model

class ImageTransformerSR(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        # per-channel intensity embeddings: 256 values x 3 channels (+1 start token for the decoder)
        self.src_emb = nn.Embedding(VOCAB * CHANNELS, d)
        self.src_pos = nn.Parameter(torch.randn(SRC_LEN, d) * 0.02)  # 8x8x3 positions, learned
        self.tgt_emb = nn.Embedding(VOCAB * CHANNELS + 1, d)
        self.row_emb = nn.Embedding(IMAGE_SIZE, d)
        self.col_emb = nn.Embedding(IMAGE_SIZE, d)
        self.ch_emb = nn.Embedding(CHANNELS, d)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_enc_layers))
        self.enc_ln = nn.LayerNorm(d)
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_dec_layers))
        self.dec_ln = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.heads = BlockwiseHeads(cfg) if cfg.n_groups > 0 else None
        self.lr_emb = nn.Embedding(VOCAB * CHANNELS, d) if cfg.lr_skip else None
        # lr_prior[ch, o + 255]: log-prior of intensity = input cell intensity + o
        self.lr_prior = nn.Parameter(torch.zeros(CHANNELS, 2 * VOCAB - 1)) if cfg.lr_prior else None
        self.apply(self._init)
        if self.lr_emb is not None:
            nn.init.zeros_(self.lr_emb.weight)  # starts as the plain model (warm starts keep it)
        if cfg.draft_emb:
            nn.init.normal_(self.heads.draft_emb, std=0.02)
        r, c, ch = target_coords()
        # the source token (8x8 input, same channel) whose 4x4 cell covers each target position
        self.register_buffer("tgt_src", (r // 4) * (INPUT_SIZE * CHANNELS) + (c // 4) * CHANNELS + ch,
                             persistent=False)
        self.register_buffer("tgt_r", r, persistent=False)
        self.register_buffer("tgt_c", c, persistent=False)
        self.register_buffer("tgt_ch", ch, persistent=False)
        self.register_buffer("src_ch", torch.arange(SRC_LEN) % CHANNELS, persistent=False)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    # --- pieces shared by the full and the incremental forward

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """src: (B, 192) long intensities of the 8x8 input in raster (row, col, channel) order."""
        x = self.src_emb(src + VOCAB * self.src_ch) + self.src_pos
        for layer in self.encoder:
            x = layer(x)
        return self.enc_ln(x)

    def cross_kv(self, enc: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.cross_attn.kv(enc).chunk(2, dim=-1) for layer in self.decoder]

    def embed_targets(self, prev_tokens: torch.Tensor, pos: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """prev_tokens: (B, T) the token before each position (-1 = start); pos: (B, T) positions;
        src: (B, 192) the 8x8 input (read only with lr_skip)."""
        prev_ch = (pos - 1) % CHANNELS
        idx = torch.where(prev_tokens < 0, VOCAB * CHANNELS, prev_tokens + VOCAB * prev_ch)
        x = self.tgt_emb(idx) + self.row_emb(self.tgt_r[pos]) + self.col_emb(self.tgt_c[pos]) \
            + self.ch_emb(self.tgt_ch[pos])
        if self.lr_emb is not None:
            x = x + self.lr_emb(self.cell_intensity(src, pos) + VOCAB * self.tgt_ch[pos])
        return x

    def out_proj(self, z: torch.Tensor) -> torch.Tensor:
        # the 256-way projection runs in the lm_head's dtype, float64 for inference: bf16 logits
        # would tie, and an fp32 matmul rounds a row differently depending on how many rows it is
        # computed with (measured: 1 row vs 2+), which flips near-tied argmaxes between a greedy
        # call and a verify call. In float64 those differences are ~1e-16 and flip nothing.
        return self.lm_head(z.to(self.lm_head.weight.dtype))

    def cell_intensity(self, src: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The 8x8 input's intensity (same channel) in the 4x4 cell covering each target position:
        src (B, 192), pos (B, ...) -> (B, ...)."""
        flat = pos.reshape(pos.shape[0], -1)
        return torch.gather(src, 1, self.tgt_src[flat]).view_as(pos)

    def prior(self, src: torch.Tensor, pos: torch.Tensor, weight: float = 1.0) -> torch.Tensor | None:
        """lr_prior's logits (B, ..., 256) for the target positions pos (B, ...) (clamped to the
        image) given the 8x8 input src (B, 192), times `weight` (1: the model as trained; more
        pulls every prediction toward the input's own intensity, see DecodeOptions.prior_weight);
        None without lr_prior."""
        if self.lr_prior is None:
            return None
        pos = pos.clamp(max=SEQ_LEN - 1)
        prior = offset_log_prior(self.lr_prior, self.tgt_ch[pos], self.cell_intensity(src, pos))
        return prior if weight == 1 else prior * weight

    def _with_prior(self, logits, src, pos, weight: float = 1.0):
        if self.lr_prior is None:
            return logits
        if src is None or pos is None:
            raise ValueError("this model has lr_prior: logits need src and the positions")
        # in the wider of the two dtypes: under bf16 autocast the logits are bf16, and rounding a
        # log-prior of -15 to bf16 moves it by up to 0.06
        dtype = torch.promote_types(logits.dtype, self.lr_prior.dtype)
        return logits.to(dtype) + self.prior(src, pos, weight).to(dtype)

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

        if self.cfg.nbr_draft:  # every head at once, by the helpers draft_heads calls per head
            fixed = self._draft_prior_fixed(read, tpos, j)
            return self._draft_prior(fixed, slice(None), read(t - 1), read(t - 3), read(t - 4))
        tab, ch, col = self.heads.nbr_prior, self.tgt_ch[t], self.tgt_c[t]
        back = (j + 2) // 3  # pixels back to the nearest decoded same channel: ceil(j / 3)
        refs = ((read(t - 3 * back), col >= back), (read(t - 3 * IMAGE_SIZE), t >= 3 * IMAGE_SIZE))
        out = 0
        for r, (val, ok) in enumerate(refs):
            row = ((j - 2) * len(refs) + r) * CHANNELS + ch  # the table's row for (head, reference, channel)
            out = out + offset_log_prior(tab, row, val) * (ok & (tpos < SEQ_LEN)).unsqueeze(-1)
        return out

    @staticmethod
    def _full_positions(h):
        """Positions 0..3071 for the states of a whole image's full forward; otherwise the
        caller must say which positions its states predict."""
        if h.dim() == 3 and h.shape[1] == SEQ_LEN:
            return torch.arange(SEQ_LEN, device=h.device).expand(h.shape[0], -1)
        return None

    def logits(self, h: torch.Tensor, src: torch.Tensor | None = None,
               pos: torch.Tensor | None = None, prior_weight: float = 1.0) -> torch.Tensor:
        """p1's logits from the final decoder states h (B, ..., d) at target positions pos
        (B, ...); h (B, 3072, d) from a whole image's full forward needs no pos. src: the
        (B, 192) input, for lr_prior (scaled by prior_weight)."""
        return self.head_logits(h, 1, src, pos, prior_weight=prior_weight)[..., 0, :]

    def head_logits(self, h: torch.Tensor, k: int, src: torch.Tensor | None = None,
                    pos: torch.Tensor | None = None, tokens: torch.Tensor | None = None,
                    prior_weight: float = 1.0) -> torch.Tensor:
        """All k heads' logits from the decoder states h (B, ..., d) -> (B, ..., k, 256).
        pos (B, ...): the positions p1 predicts; head j predicts the token j-1 after it.
        tokens (B, S): the intensities decoded so far, at their positions (nbr_prior reads
        them; a whole image's targets in training)."""
        if k > 1 and self.cfg.draft_emb:
            pos = self._full_positions(h) if pos is None else pos
            if tokens is None or pos is None:
                raise ValueError("this model has draft_emb: heads 2..k need the decoded tokens and positions")
            return self._heads_one_by_one(h, k, src, pos, tokens, prior_weight=prior_weight)[0]
        z, pos = self._heads_before_nbr(h, k, src, pos, prior_weight)
        if k > 1 and self.cfg.nbr_prior:
            if tokens is None or pos is None:
                raise ValueError("this model has nbr_prior: heads 2..k need the decoded tokens and positions")
            nbr = self.neighbour_prior(tokens, pos[..., 1:], torch.arange(2, k + 1, device=h.device))
            z = torch.cat([z[..., :1, :], z[..., 1:, :] + nbr.to(z.dtype)], dim=-2)
        return z

    def _heads_before_nbr(self, h, k, src, pos, prior_weight=1.0):
        """The k heads' logits with lr_prior but without nbr_prior, and each head's position."""
        if self.cfg.head1 == "base":
            z = self.out_proj(h).unsqueeze(-2)
            if k > 1:
                z = torch.cat([z, self.out_proj(self.heads(h, k - 1))], dim=-2)
        else:
            z = self.out_proj(self.heads(h, k))
        pos = self._full_positions(h) if pos is None else pos
        if pos is not None:
            pos = pos.unsqueeze(-1) + torch.arange(k, device=h.device)
        return self._with_prior(z, src, pos, prior_weight), pos

    def draft_heads(self, h: torch.Tensor, k: int, src: torch.Tensor, pos: torch.Tensor,
                    tokens: torch.Tensor, choose=None, prior_weight: float = 1.0,
                    with_logits: bool = False, first: torch.Tensor | None = None):
        """A block's k proposals (b, k) from decoder states h (b, d) that predict positions pos
        (b,), given the decoded intensities tokens (b, S) (read before pos only). The first is
        p1's argmax, or `first` (b,) where given (speculative sampling's sampled token); heads
        2..k choose with `choose(logits, i)`: logits (b, 256) of the head at index i of 2..k (or
        (b, k-1, 256) and i = slice(None), all at once) -> tokens; default argmax.
        With nbr_draft a head's prior reads the proposals before it, so they are made one head
        at a time; each equals what `head_logits` gives when the tokens hold those proposals.
        with_logits: also returns the logits heads 2..k chose from, (b, k-1, 256) (the draft
        distributions speculative sampling verifies against; k=1: None)."""
        props, head_logits = self._draft(h, k, src, pos, tokens, choose or (lambda z, i: z.argmax(-1)),
                                         prior_weight, first)
        return (props, head_logits) if with_logits else props

    def _draft(self, h, k, src, pos, tokens, choose, prior_weight, first=None):
        """draft_heads' proposals (b, k) and heads 2..k's logits (b, k-1, 256) (None for k=1)."""
        if k > 1 and self.cfg.draft_emb:
            logits, props = self._heads_one_by_one(h, k, src, pos, tokens, choose, prior_weight, first)
            return props, logits[:, 1:]
        z, _ = self._heads_before_nbr(h, k, src, pos, prior_weight)
        first = z[:, 0].argmax(-1) if first is None else first
        if k == 1:
            return first[:, None], None
        if not self.cfg.nbr_prior:
            return torch.cat([first[:, None], choose(z[:, 1:], slice(None))], 1), z[:, 1:]
        j = torch.arange(2, k + 1, device=h.device)
        if not self.cfg.nbr_draft:  # every reference is decoded: all heads at once
            nbr = self.neighbour_prior(tokens, pos[:, None] + j - 1, j)
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
        fixed = self._draft_prior_fixed(decoded, u, j)
        props, zs = [first], []
        for i in range(1, k):  # head i+1, target pos + i: proposals made so far are props[0..i-1]
            left = props[i - 3] if i >= 3 else left_dec[:, i - 1]
            back4 = props[i - 4] if i >= 4 else back4_dec[:, i - 1]
            nbr = self._draft_prior(fixed, i - 1, props[i - 1], left, back4)
            zs.append(z[:, i] + nbr.to(z.dtype))
            props.append(choose(zs[-1], i - 1))
        return torch.stack(props, 1), torch.stack(zs, 1)

    def _draft_prior_fixed(self, read, u, j):
        """nbr_draft's parts that do not depend on the block's proposals, for heads j (k-1,)
        with targets u (..., k-1): each head's table rows, which references exist, and the
        above reference's log-prior (decoded: read once for all heads, with `read`)."""
        C = CHANNELS
        t = u.clamp(max=SEQ_LEN - 1)
        ch, col, inside = self.tgt_ch[t], self.tgt_c[t], u < SEQ_LEN
        rows0 = ((j - 2) * 3) * C + ch  # table rows of the left, above and G/B references
        ok = [((col >= 1) & inside).unsqueeze(-1), ((t >= 3 * IMAGE_SIZE) & inside).unsqueeze(-1),
              ((ch > 0) & (col >= 1) & inside).unsqueeze(-1)]
        above = offset_log_prior(self.heads.nbr_prior, rows0 + C, read(t - 3 * IMAGE_SIZE)) * ok[1]
        return rows0, ok, above

    def _draft_prior(self, fixed, a, prev, left, back4):
        """Head a+2's nbr_draft log-prior (..., 256) (a = slice(None): every head's) from
        `_draft_prior_fixed` and the intensities 1, 3 and 4 before its target (decoded or
        proposed): the pixel just left, the one above, and for G and B the pixel's previous
        channel plus how the left pixel's two channels differ."""
        rows0, ok, above = fixed
        tab = self.heads.nbr_prior
        grad = (prev + left - back4).clamp(0, VOCAB - 1)
        nbr = offset_log_prior(tab, rows0[..., a], left) * ok[0][..., a, :] + above[..., a, :]
        return nbr + offset_log_prior(tab, rows0[..., a] + 2 * CHANNELS, grad) * ok[2][..., a, :]

    def _draft_rows(self, u):
        """draft_emb's embedding rows for targets u, before the intensities are added: (the
        intensity just before u, the same channel one pixel left); 768 ('none') where the
        reference is outside the image."""
        t = u.clamp(max=SEQ_LEN - 1)
        none = CHANNELS * VOCAB
        return (torch.where(t >= 1, VOCAB * self.tgt_ch[(t - 1).clamp(min=0)], none),
                torch.where(self.tgt_c[t] >= 1, VOCAB * self.tgt_ch[t], none))

    def _draft_embed(self, prev, left, rows):
        """draft_emb's reference embeddings (..., d) of the intensities prev and left at `rows`."""
        none, E = CHANNELS * VOCAB, self.heads.draft_emb
        return E[0][torch.where(rows[0] < none, prev + rows[0], none)] \
            + E[1][torch.where(rows[1] < none, left + rows[1], none)]

    def draft_refs(self, tokens: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """draft_emb's reference embeddings (B, ..., d) for heads whose targets are u (B, ...),
        read from tokens (B, S): the intensity just before the target and the same channel one
        pixel left (none in the first column)."""
        def read(q):
            return intensities_at(tokens, q).clamp(0, VOCAB - 1)

        return self._draft_embed(read(u - 1), read(u - 3), self._draft_rows(u))

    def _heads_one_by_one(self, h, k, src, pos, tokens, choose=None, prior_weight=1.0, first=None):
        """draft_emb's heads, one at a time: each reads the intensities before its target from
        `tokens`. With `choose` (drafting) each head's proposal is written into a copy of tokens
        before the next head runs; without, tokens are the targets (training's teacher forcing,
        the replay). -> (logits (..., k, 256), proposals (..., k)); p1's is its argmax. Both
        uses run this one function, so a draft's logits are bit for bit head_logits' (tested).
        What does not depend on the block's proposals (positions, the above reference, the
        input prior) is read once for all heads: per head only ~30 small ops remain (a call
        to neighbour_prior and draft_refs per head was ~70, measured 3x slower at batch 32)."""
        H, f = self.heads, self.heads.f
        B, S = tokens.shape
        if choose is not None:  # a copy to write the proposals into (tokens may end at pos)
            buf = tokens.new_zeros(B, max(S, SEQ_LEN + k))
            buf[:, :S] = tokens
            S = buf.shape[1]
        else:
            buf = tokens

        def read(q):  # intensities at positions q (B, ...), decoded or (drafting) proposed
            return intensities_at(buf, q)

        dev = h.device
        p1 = self._with_prior(self.out_proj(h), src, pos, prior_weight)
        logits, props = [p1], [p1.argmax(-1) if first is None else first]
        if choose is not None:
            buf.scatter_(1, pos.reshape(B, -1), props[0].reshape(B, -1))
        # heads 2..k: targets u, as (..., k-1)
        j = torch.arange(2, k + 1, device=dev)
        u = pos.unsqueeze(-1) + j - 1
        rows = self._draft_rows(u)
        prior = self.prior(src, u, prior_weight)  # None without lr_prior
        if self.cfg.nbr_draft:  # neighbour_prior's references, as draft_heads reads them
            fixed = self._draft_prior_fixed(read, u, j)
        elif self.cfg.nbr_prior:  # every reference is decoded: all heads at once
            nbr_all = self.neighbour_prior(buf, u, j)
        pre = F.linear(h, H.up.weight[:(k - 1) * f], H.up.bias[:(k - 1) * f])
        back = torch.tensor([1, 3, 4], device=dev)
        hidden = []
        for a in range(k - 1):  # head a + 2, target u[..., a]
            ua = u[..., a]
            v = read(ua.unsqueeze(-1) - back)  # the intensities 1, 3 and 4 before the target
            prev, left, back4 = v[..., 0], v[..., 1], v[..., 2]
            draft = self._draft_embed(prev, left, (rows[0][..., a], rows[1][..., a]))
            z = self.out_proj(H.group(h, pre, hidden, a, draft))
            if prior is not None:  # as _with_prior adds it
                dt = torch.promote_types(z.dtype, prior.dtype)
                z = z.to(dt) + prior[..., a, :].to(dt)
            if self.cfg.nbr_draft:
                z = z + self._draft_prior(fixed, a, prev, left, back4).to(z.dtype)
            elif self.cfg.nbr_prior:
                z = z + nbr_all[..., a, :].to(z.dtype)
            logits.append(z)
            if choose is not None:
                props.append(choose(z, a))
                buf.scatter_(1, ua.reshape(B, -1).clamp(max=S - 1), props[-1].reshape(B, -1))
        return torch.stack(logits, -2), (torch.stack(props, -1) if choose is not None else None)

    # --- full (teacher-forced) forward, used for training and for checking the cache

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """src: (B, 192), tgt: (B, T) long, T a multiple of block_len (3072 for a whole image; a
        shorter prefix gives the same states for its positions). Returns states (B, T, d)."""
        B, T = tgt.shape
        enc = self.encode(src)
        prev = torch.cat([torch.full((B, 1), -1, dtype=tgt.dtype, device=tgt.device), tgt[:, :-1]], 1)
        pos = torch.arange(T, device=tgt.device).expand(B, T)
        x = self.embed_targets(prev, pos, src)
        for layer, (ek, ev) in zip(self.decoder, self.cross_kv(enc)):
            x = layer(x, ek, ev)
        return self.dec_ln(x)

    # --- incremental forward with a preallocated KV cache

    def for_inference(self, dtype: torch.dtype = torch.bfloat16) -> "ImageTransformerSR":
        """Cast for decoding: everything in `dtype` except the output projection (float64)."""
        prior = None if self.lr_prior is None else self.lr_prior.detach().double()
        has_nbr = self.heads is not None and self.heads.nbr_prior is not None
        nbr = self.heads.nbr_prior.detach().double() if has_nbr else None
        self.eval().to(dtype)
        self.lm_head.double()
        if prior is not None:  # added to the float64 logits: keep it in float64 too
            self.lr_prior.data = prior
        if nbr is not None:
            self.heads.nbr_prior.data = nbr
        if self.heads is not None:  # the masked head matrix, once, not at every call
            with torch.no_grad():
                self.heads.down.weight.mul_(self.heads.tri_mask.to(dtype))
            self.heads.premasked = True
        return self

    def new_cache(self, src: torch.Tensor, max_extra: int = 16) -> "KVCache":
        return KVCache(self, src, max_extra)

    def step(self, cache: "KVCache", tokens: torch.Tensor, pos: torch.Tensor,
             rows: torch.Tensor | None = None) -> torch.Tensor:
        """Feed n decoder inputs per image. tokens: (B, n) the previous token of each position
        (-1 = start), pos: (B,) the first position of each image's n inputs, rows: which images
        of the cache these are (default all). K/V are written at their positions; each query reads
        only its local window. Returns the final decoder states (B, n, d).

        A query's state is bit for bit the same whether it comes alone (greedy) or inside a k-token
        verify call, in any batch: this is what keeps exact mode exact in bf16 (tested in
        tests/test_model.py). So both attentions run in float64 (`attention64`). The self-attention
        reads one contiguous key window per image, from the first query's window start (its
        block's previous block) to the last query, and masks each query to its own window.
        """
        B, n = tokens.shape
        if n > cache.max_extra:
            raise ValueError(f"step got {n} tokens per image; the cache allows {cache.max_extra}")
        L = self.cfg.block_len
        dev = tokens.device
        qpos = pos[:, None] + torch.arange(n, device=dev)  # (B, n)
        src = cache.src if rows is None else cache.src[rows]
        x = self.embed_targets(tokens, qpos.clamp(max=SEQ_LEN - 1), src)
        qlo = ((qpos // L - 1) * L).clamp(min=0)  # (B, n) each query's window start
        kpos = qlo[:, :1] + torch.arange(2 * L + n, device=dev)  # (B, W) covers every window
        mask_t = ((kpos[..., None] >= qlo[:, None]) & (kpos[..., None] <= qpos[:, None]))[:, None]
        bidx = (torch.arange(B, device=dev) if rows is None else rows)[:, None]
        H = self.cfg.n_heads
        hidx = torch.arange(H, device=dev)[None, :, None]

        for i, layer in enumerate(self.decoder):
            a = layer.self_attn
            q, k, v = a.qkv(layer.ln1(x)).chunk(3, dim=-1)
            # cache layout (B, H, position, hd): a window read is contiguous per head
            cache.k[i][bidx, :, qpos] = k.view(B, n, H, -1)
            cache.v[i][bidx, :, qpos] = v.view(B, n, H, -1)
            kw = cache.k[i][bidx[..., None], hidx, kpos[:, None]]  # (B, H, W, hd)
            vw = cache.v[i][bidx[..., None], hidx, kpos[:, None]]
            x = x + a.out(a.merge(attention64(a.split(q), kw, vw, mask_t)).to(x.dtype))
            c = layer.cross_attn
            ek, ev = cache.enc_k[i], cache.enc_v[i]
            if rows is not None:
                ek, ev = ek[rows], ev[rows]
            x = x + c.out(c.merge(attention64(c.split(c.q(layer.ln2(x))), ek, ev)).to(x.dtype))
            x = x + layer.ff(layer.ln3(x))
        return self.dec_ln(x)


class KVCache:
    """Preallocated per-layer decoder K/V (B, heads, 3072 + 3*block_len + 2*extra, head dim), plus
    the encoder's cross-attention K/V computed once per image. Positions past the image end exist so that
    proposals near the end can be written; their keys are never read by a real position.
    Rejected proposals are simply overwritten when the position reaches them again."""

    def __init__(self, model: ImageTransformerSR, src: torch.Tensor, max_extra: int):
        cfg = model.cfg
        B = src.shape[0]
        dtype = next(model.parameters()).dtype
        if torch.is_autocast_enabled(src.device.type):
            dtype = torch.get_autocast_dtype(src.device.type)
        self.max_extra = max_extra
        self.src = src
        size = SEQ_LEN + 3 * cfg.block_len + 2 * max_extra  # room for windows past the end
        H = cfg.n_heads
        self.k = [torch.zeros(B, H, size, cfg.d_model // H, dtype=dtype, device=src.device)
                  for _ in model.decoder]
        self.v = [torch.zeros_like(t) for t in self.k]
        enc = model.encode(src)
        # split into heads and in float64 once, for step's attention64: (B, H, 192, hd)
        split = model.decoder[0].cross_attn.split
        kv = model.cross_kv(enc)
        self.enc_k = [split(k).double().contiguous() for k, _ in kv]
        self.enc_v = [split(v).double().contiguous() for _, v in kv]
