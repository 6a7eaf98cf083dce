"""The acceptance rules of blockwise decoding, and the window proposals of the eps rule."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .options import DecodeOptions

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


def window_mass(logits: torch.Tensor, eps: int) -> torch.Tensor:
    """(..., 256) logits -> (..., 256) each intensity v's P(|x - v| <= eps) / (2 eps + 1)."""
    p = logits.float().softmax(-1)
    mass = F.avg_pool1d(p.reshape(-1, 1, p.shape[-1]), 2 * eps + 1, stride=1, padding=eps,
                        count_include_pad=True)  # window sums / (2 eps + 1): same order
    return mass.view(p.shape)


def window_centre(logits: torch.Tensor, eps: int) -> torch.Tensor:
    """(..., 256) logits -> (...) the intensity v that maximizes P(|x - v| <= eps)."""
    return window_mass(logits, eps).argmax(-1)
