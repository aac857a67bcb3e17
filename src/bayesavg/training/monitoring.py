"""When and on what the loop watches a run: validation and test curves, never a choice.

On CIFAR, evaluating validation and test every epoch, and recomputing the
running average's BatchNorm statistics over the whole training split, costs
about 70k extra forward images an epoch: a quarter to a whole epoch of
training. ``every`` thins the curve points (the last epoch always has one);
``fraction`` evaluates a fixed subset, drawn once from ``seed``, so every
point of a curve and every trajectory of a pipeline see the same images.
Nothing read by a posterior or a predictor depends on these settings: the
monitoring passes run in eval mode and draw no random numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..data.inputs import Inputs
from .batches import Tensors


@dataclass(frozen=True)
class Monitoring:
    every: int = 1
    fraction: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.every < 1 or not 0 < self.fraction <= 1:
            raise ValueError(f"monitoring every {self.every} epochs on {self.fraction}: invalid")

    def due(self, epoch: int, epochs: int) -> bool:
        """Whether 1-based ``epoch`` of ``epochs`` gets a curve point."""
        return epoch % self.every == 0 or epoch == epochs

    def rows(self, n: int, device: torch.device) -> torch.Tensor | None:
        """The sorted rows of an ``n``-row split to evaluate; None for all of them."""
        k = max(1, round(self.fraction * n))
        if k >= n:
            return None
        draw = torch.Generator().manual_seed(self.seed)
        return torch.randperm(n, generator=draw)[:k].sort().values.to(device)

    def subset(self, data: Tensors) -> Tensors:
        idx = self.rows(len(data), data.y.device)
        return data if idx is None else Tensors(_rows(data.x, idx), data.y[idx])

    def inputs(self, x: Inputs) -> Inputs:
        idx = self.rows(x.shape[0], x.device)
        return x if idx is None else x.subset(idx)


def _rows(x: torch.Tensor | Inputs, idx: torch.Tensor) -> torch.Tensor | Inputs:
    """Rows ``idx`` of ``x``, still read a batch at a time where ``x`` is."""
    return x.subset(idx) if isinstance(x, Inputs) else x[idx]


EVERY_EPOCH = Monitoring()


def row_line(row: Mapping[str, float]) -> str:
    """An epoch's (or round's) row as its log line: ``key=value``, without the epoch
    number and time the line says elsewhere, and without a metric that does not exist
    yet (NaN: the running average before its first snapshot, kept so in the history)."""
    return ", ".join(
        f"{k}={v:.4g}"
        for k, v in row.items()
        if k not in ("epoch", "seconds") and not (isinstance(v, float) and math.isnan(v))
    )
