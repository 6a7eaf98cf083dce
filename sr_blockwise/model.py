"""The Image Transformer for 8x8 -> 32x32 super-resolution, with blockwise heads.

Encoder: the 8x8x3 input as 192 channel tokens, full self-attention.
Decoder: the 3072 target intensities in raster order (row, column, channel), shifted right,
local 1D self-attention (query blocks of `block_len`, each sees itself causally plus the whole
previous block), cross-attention to the encoder, a 256-way output per intensity.
The blockwise heads that propose k tokens from one decoder state, and their priors, are in
heads.py; this module makes the decoder states (full forward for training, cached `step` for
decoding) and p1's logits.

Deviations from the paper, each for a reason written next to it:
- pre-norm instead of post-norm (trains stably in the short runs a 2-core CPU allows);
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
- the heads' deviations (nested heads, head1, nbr_prior, nbr_draft) are in heads.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import heads as _heads
from .data import CHANNELS, IMAGE_SIZE, INPUT_SIZE, SEQ_LEN, SRC_LEN, VOCAB  # noqa: F401 (importable from here)
from .heads import BlockwiseHeads, offset_log_prior, target_coords


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

    @property
    def n_groups(self) -> int:
        """Head groups in the blockwise layer (head 1 needs none when it is the base)."""
        return self.n_blockwise - 1 if self.head1 == "base" else self.n_blockwise

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        if d.pop("draft_emb", False):  # shipped weights' JSON says false
            raise ValueError("draft_emb=true: the option was measured and not kept (experiments/heads/); "
                             "this version cannot run such weights")
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
    # for training on a GPU (gpu/README.md): the cpu preset's features, 1.5x as wide
    # and 6 decoder layers; 7.25M parameters (a compact checkpoint of 14.8 MB)
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
        # the heads' measured rank accuracies by rule, from the weights' card: decoding/tree.py
        self.tree_accuracy: dict = {}
        self.apply(self._init)
        if self.lr_emb is not None:
            nn.init.zeros_(self.lr_emb.weight)  # starts as the plain model (warm starts keep it)
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

    def with_prior(self, logits, src, pos, weight: float = 1.0):
        """logits (B, ..., 256) at target positions pos (B, ...) plus lr_prior's (times weight);
        unchanged without lr_prior. p1 and every head get it (heads.py)."""
        if self.lr_prior is None:
            return logits
        if src is None or pos is None:
            raise ValueError("this model has lr_prior: logits need src and the positions")
        # in the wider of the two dtypes: under bf16 autocast the logits are bf16, and rounding a
        # log-prior of -15 to bf16 moves it by up to 0.06
        dtype = torch.promote_types(logits.dtype, self.lr_prior.dtype)
        return logits.to(dtype) + self.prior(src, pos, weight).to(dtype)

    def logits(self, h: torch.Tensor, src: torch.Tensor | None = None,
               pos: torch.Tensor | None = None, prior_weight: float = 1.0) -> torch.Tensor:
        """p1's logits from the final decoder states h (B, ..., d) at target positions pos
        (B, ...); h (B, 3072, d) from a whole image's full forward needs no pos. src: the
        (B, 192) input, for lr_prior (scaled by prior_weight)."""
        return self.head_logits(h, 1, src, pos, prior_weight=prior_weight)[..., 0, :]

    def head_logits(self, h: torch.Tensor, k: int, src: torch.Tensor | None = None,
                    pos: torch.Tensor | None = None, tokens: torch.Tensor | None = None,
                    prior_weight: float = 1.0) -> torch.Tensor:
        """All k heads' logits (B, ..., k, 256): heads.head_logits."""
        return _heads.head_logits(self, h, k, src, pos, tokens, prior_weight)

    def draft_heads(self, h: torch.Tensor, k: int, src: torch.Tensor, pos: torch.Tensor,
                    tokens: torch.Tensor, choose=None, prior_weight: float = 1.0,
                    with_logits: bool = False, first: torch.Tensor | None = None, given: tuple | None = None):
        """A block's k proposals (b, k): heads.draft_heads."""
        return _heads.draft_heads(self, h, k, src, pos, tokens, choose, prior_weight, with_logits, first, given)

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
            x = self._cross_and_ff(layer, i, x, cache, rows)
        return self.dec_ln(x)

    @staticmethod
    def _cross_and_ff(layer: DecoderLayer, i: int, x: torch.Tensor, cache: "KVCache", rows) -> torch.Tensor:
        """A cached decoder layer's second half: cross-attention to the encoder (float64, as in
        `step`) and the feed-forward block."""
        c = layer.cross_attn
        ek, ev = cache.enc_k[i], cache.enc_v[i]
        if rows is not None:
            ek, ev = ek[rows], ev[rows]
        x = x + c.out(c.merge(attention64(c.split(c.q(layer.ln2(x))), ek, ev)).to(x.dtype))
        return x + layer.ff(layer.ln3(x))

    def step_tree(self, cache: "KVCache", tokens: torch.Tensor, pos: torch.Tensor, depth: torch.Tensor,
                  ancestors: torch.Tensor, rows: torch.Tensor | None = None):
        """Feed a tree of N nodes per image in one call (tree verification). tokens: (B, N) each
        node's token, fed as the previous token of position pos + depth (pos (B,): the position
        after the last confirmed token; depth (N,) each node's depth, the root 0); ancestors
        (N, N) True where node j is node i's ancestor or itself. A node reads the cache's
        confirmed keys (positions < pos) in its local window, and its own path's keys, as `step`
        would read them had the path been fed as a chain: so its state is the chain's. Nothing
        is written to the cache (nodes of one depth share a position): returns the final states
        (B, N, d) and every layer's node keys and values [(k, v) (B, H, N, hd)], which
        `keep_path` writes for the accepted path."""
        B, N = tokens.shape
        L, H = self.cfg.block_len, self.cfg.n_heads
        dev = tokens.device
        qpos = pos[:, None] + depth  # (B, N)
        src = cache.src if rows is None else cache.src[rows]
        x = self.embed_targets(tokens, qpos.clamp(max=SEQ_LEN - 1), src)
        qlo = ((qpos // L - 1) * L).clamp(min=0)
        kpos = qlo[:, :1] + torch.arange(2 * L, device=dev)  # (B, 2L) the root's window covers every node's
        mask_t = torch.cat([(kpos[..., None] >= qlo[:, None]) & (kpos[..., None] < pos[:, None, None]),
                            ancestors.T[None].expand(B, N, N)], dim=1)[:, None]  # (B, 1, 2L + N, N)
        bidx = (torch.arange(B, device=dev) if rows is None else rows)[:, None, None]
        hidx = torch.arange(H, device=dev)[None, :, None]
        kv = []
        for i, layer in enumerate(self.decoder):
            a = layer.self_attn
            q, k, v = a.qkv(layer.ln1(x)).chunk(3, dim=-1)
            k, v = a.split(k), a.split(v)  # (B, H, N, hd)
            kv.append((k, v))
            kw = torch.cat([cache.k[i][bidx, hidx, kpos[:, None]], k], dim=2)  # (B, H, 2L + N, hd)
            vw = torch.cat([cache.v[i][bidx, hidx, kpos[:, None]], v], dim=2)
            x = x + a.out(a.merge(attention64(a.split(q), kw, vw, mask_t)).to(x.dtype))
            x = self._cross_and_ff(layer, i, x, cache, rows)
        return self.dec_ln(x), kv

    @staticmethod
    def keep_path(cache: "KVCache", kv, path: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor) -> None:
        """Write the keys and values of the nodes `path` (B, D) (from step_tree's kv) at
        positions pos + 0..D-1 of images rows: the accepted path becomes the cache's chain.
        Entries past the accepted length land past the confirmed prefix, where nothing reads
        them before they are overwritten."""
        B, D = path.shape
        qpos = pos[:, None] + torch.arange(D, device=pos.device)
        at = path[:, None, :, None]
        for i, (k, v) in enumerate(kv):
            idx = at.expand(B, k.shape[1], D, k.shape[-1])
            cache.k[i][rows[:, None], :, qpos] = k.gather(2, idx).transpose(1, 2)
            cache.v[i][rows[:, None], :, qpos] = v.gather(2, idx).transpose(1, 2)


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
        self.enc_k, self.enc_v = self.encoded(model, src)

    @staticmethod
    def encoded(model: ImageTransformerSR, src: torch.Tensor):
        """The encoder's cross-attention keys and values per decoder layer, split into heads and
        in float64 once, for step's attention64: two lists of (B, H, 192, hd)."""
        split = model.decoder[0].cross_attn.split
        kv = model.cross_kv(model.encode(src))
        return [split(k).double().contiguous() for k, _ in kv], [split(v).double().contiguous() for _, v in kv]

    def load(self, model: ImageTransformerSR, src: torch.Tensor) -> None:
        """Take new inputs into the same tensors (a captured CUDA graph reads these addresses)."""
        self.src.copy_(src)
        for old, new in zip(self.enc_k + self.enc_v, sum(self.encoded(model, src), [])):
            old.copy_(new)
