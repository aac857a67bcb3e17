"""SWAG: a Gaussian over the weights from the SGD trajectory (ALGORITHMS §2)."""

from __future__ import annotations

import math

import torch

from ..training import ieee
from .moments import MomentCollector


class SWAG(MomentCollector):
    """SWA mean, diagonal variance and low-rank deviations, with sampling.

    Unlike the reference code, the low-rank term is divided by sqrt(k - 1)
    for the k columns actually held, and one z2 is shared by the whole vector.
    """

    def sample(
        self,
        scale: float = 0.5,
        diag_only: bool = False,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """theta = mean + sqrt(scale) * (sqrt(var) * z1 + D^T z2 / sqrt(k - 1))."""
        if self.n_collected == 0:
            raise RuntimeError("SWAG.sample() called before any snapshot was collected")
        if scale < 0:
            raise ValueError(f"scale must be >= 0, got {scale}")
        mean = self.mean
        if scale == 0:
            return mean
        z1 = torch.randn(self.num_params, generator=generator, device=self.device, dtype=self.dtype)
        noise = ieee.sqrt(self.variance()) * z1
        k = self.rank
        if not diag_only and k >= 2:
            z2 = torch.randn(k, generator=generator, device=self.device, dtype=self.dtype)
            noise += (self.deviations.T @ z2) / math.sqrt(k - 1)
        return mean + math.sqrt(scale) * noise
