"""SWAG: a Gaussian over the weights from the SGD trajectory (ALGORITHMS §2)."""

from __future__ import annotations

import math
from collections.abc import Callable

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
        return self.sampler(scale, diag_only, generator)()

    def sampler(
        self,
        scale: float = 0.5,
        diag_only: bool = False,
        generator: torch.Generator | None = None,
    ) -> Callable[[], torch.Tensor]:
        """``sample`` with its arguments fixed: the mean and sqrt(var) are computed once, not
        for each of a predictor's networks (for LeNet-5 they were a third of a draw). Draw
        i gives the bytes of the i-th ``sample`` call from the same generator, as long as
        the collector collects nothing more meanwhile."""
        if self.n_collected == 0:
            raise RuntimeError("SWAG.sample() called before any snapshot was collected")
        if scale < 0:
            raise ValueError(f"scale must be >= 0, got {scale}")
        mean = self.mean
        if scale == 0:
            return mean.clone  # a fresh tensor each draw, as every other draw is
        std = ieee.sqrt(self.variance())
        k = self.rank
        # the rows oldest first: a copy once more than max_rank were collected, made once
        deviations = self.deviations if not diag_only and k >= 2 else None

        def draw() -> torch.Tensor:
            z1 = torch.randn(
                self.num_params, generator=generator, device=self.device, dtype=self.dtype
            )
            noise = std * z1
            if deviations is not None:
                z2 = torch.randn(k, generator=generator, device=self.device, dtype=self.dtype)
                noise += (deviations.T @ z2) / math.sqrt(k - 1)
            return mean + math.sqrt(scale) * noise

        return draw
