"""What a decode returns: the faces, each image's statistics, and the block map."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..model import SEQ_LEN

@dataclass
class DecodeStats:
    calls: int  # model calls this image took part in (the first, prefix-free call included)
    block_hist: list[int]  # block_hist[n-1] = number of steps that accepted n tokens
    seconds: float  # wall time from the start of the decode until this image finished
    tokens: int = SEQ_LEN

    @property
    def mean_block(self) -> float:
        """Mean accepted block size: tokens per decoding step (the paper's Table 2 measure)."""
        return self.tokens / max(1, sum(self.block_hist))

    def to_dict(self) -> dict:
        return {"calls": self.calls, "block_hist": self.block_hist, "seconds": self.seconds,
                "mean_block": self.mean_block}


@dataclass
class DecodeResult:
    images: np.ndarray  # (B, 32, 32, 3) uint8
    stats: list[DecodeStats]
    block_map: np.ndarray  # (B, 3072) length of the accepted block each token came from
    seconds: float  # wall time of the whole batch
    calls: int = 0  # batched model calls
    extra: dict = field(default_factory=dict)


def pooled_block_hist(stats: list[DecodeStats]) -> tuple[np.ndarray, float]:
    """Block histograms summed over images, and the mean accepted block they give: all tokens /
    all decoding steps (the paper's Table 2 measure over a test set)."""
    hist = np.zeros(max(len(s.block_hist) for s in stats), dtype=np.int64)
    for s in stats:
        hist[: len(s.block_hist)] += s.block_hist
    return hist, SEQ_LEN * len(stats) / int(hist.sum())
