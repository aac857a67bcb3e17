"""Stochastic gradient Langevin dynamics as an optimizer of the training loop.

torch has no SGLD (the base class is ``bayesavg.training.optim``'s: see there why).
With the loss written per data point (mean cross-entropy
plus ``weight_decay / 2 * |theta|^2``, a Gaussian prior), one step is

    theta <- theta - lr * (grad + weight_decay * theta) + sqrt(2 lr / N) * xi,

xi ~ N(0, I): Langevin dynamics on the posterior of N training points with
step size lr / N (Welling & Teh 2011). The gradient may come from any step
of the training loop, so F-SGLD is the SAM gradient followed by this noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ..training.optim import Optimizer


class SGLD(Optimizer):
    def __init__(
        self,
        params: Iterable[torch.Tensor],
        n_train: int,
        lr: float = 0.0,
        weight_decay: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> None:
        if n_train < 1:
            raise ValueError(f"n_train must be >= 1, got {n_train}")
        if lr < 0 or weight_decay < 0:
            raise ValueError("lr and weight_decay must be >= 0")
        super().__init__(params, lr=lr, weight_decay=weight_decay)
        self.n_train = n_train
        # The noise's stream: torch's global one by default; under data parallelism one
        # generator seeded alike on every rank, so all ranks take the same step.
        self.generator = generator

    def noise_std(self, lr: float) -> float:
        """The per-coordinate noise of one step: sqrt(2 lr / N)."""
        return math.sqrt(2.0 * lr / self.n_train)

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        lr, wd = group["lr"], group["weight_decay"]
        std = self.noise_std(lr)
        for p in self._with_grads():
            drift = p.grad.add(p, alpha=wd) if wd else p.grad
            p.add_(drift, alpha=-lr)
            noise = torch.randn(p.shape, generator=self.generator, dtype=p.dtype, device=p.device)
            p.add_(noise, alpha=std)
