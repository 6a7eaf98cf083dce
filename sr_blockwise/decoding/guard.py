"""The cell guard: p1 pulled back where a 4x4 cell drifts far from its 8x8 input pixel."""
from __future__ import annotations

import torch

from ..model import SEQ_LEN

# ---------------------------------------------------------------- the cell guard

# how steeply the cell guard's penalty grows: nats per level of the cell's mean offset past the
# tolerance (experiments/cell-guard/: 1 left a quarter of the collapses, 4 and 8 none)
GUARD_SLOPE = 4.0


def _cell_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """For each position: the 16 positions of its 4x4 cell and channel, in decoding order
    (3072, 16), and the index of its cell's pixel in the 8x8 input's 192 intensities (3072,)."""
    p = torch.arange(SEQ_LEN)
    row, col, ch = p // 96, (p // 3) % 32, p % 3
    dr, dc = torch.arange(4).repeat_interleave(4), torch.arange(4).repeat(4)
    cell = (row[:, None] // 4 * 4 + dr) * 96 + (col[:, None] // 4 * 4 + dc) * 3 + ch[:, None]
    return cell, (row // 4) * 24 + (col // 4) * 3 + ch


CELL_POSITIONS, CELL_INPUT = _cell_tables()


def cell_guard(logits: torch.Tensor, src: torch.Tensor, pos: torch.Tensor, tokens: torch.Tensor | None,
               guard: float, read=None) -> torch.Tensor:
    """p1's logits (B, ..., 256) at positions pos (B, ...) with the cell guard: at each intensity
    v, minus GUARD_SLOPE * max(0, |D + v - x| / 16 - guard), where x is the 8x8 input's (src (B,
    192)) pixel under the position and D the sum of (token - x) over the positions of its 4x4
    cell and channel before it: the cell's mean offset from x if its other pixels came out at x.
    tokens (B, >= 3072) hold every token before each position (those after it do not count). A
    greedy decode that collapses drifts a cell's mean far off its input pixel (the final mean of a
    real face's cell is its input pixel, and its running D / 16 stays under 55 levels:
    experiments/cell-guard/); the guard pulls the cell back once it is past `guard` levels and
    leaves every other position's logits as they are. guard 0: the logits unchanged. read: instead
    of tokens, a function from positions (B, ..., 16) to the tokens there (a tree's nodes each
    have their own path)."""
    if not guard:
        return logits
    B = pos.shape[0]
    pos = pos.clamp(max=SEQ_LEN - 1)
    x = src.gather(1, CELL_INPUT.to(pos.device)[pos].reshape(B, -1)).view_as(pos)
    cell = CELL_POSITIONS.to(pos.device)[pos]  # (B, ..., 16)
    decoded = read(cell) if read is not None else tokens.gather(1, cell.reshape(B, -1)).view_as(cell)
    D = ((decoded - x[..., None]) * (cell < pos[..., None])).sum(-1)
    v = torch.arange(logits.shape[-1], device=logits.device)
    over = (D[..., None] + v - x[..., None]).abs().to(logits.dtype) / 16 - guard
    return logits - GUARD_SLOPE * over.clamp(min=0)
