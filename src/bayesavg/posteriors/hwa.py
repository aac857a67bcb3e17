"""HWA: averages of variational snapshots from a cyclic SVI run (ALGORITHMS §4).

Snapshot j is (mu_j, rho_j). The same moment collector as SWAG keeps the
mean, second moment and last-K deviations of mu, the running mean of
sigma^2 and (for the authors' rho-space ablation) the running mean of rho.
"""

from __future__ import annotations

from typing import Any

import torch

from ..training import ieee
from .moments import MomentCollector
from .swag import SWAG

# The three predictives over the snapshots (ALGORITHMS §4): the moment-matched
# mixture, mean-field with averaged variances, and the rho-space average.
VARIANTS = ("hwa", "hwa_mf", "hwa_rho")


class HWA:
    def __init__(
        self,
        num_params: int,
        max_rank: int = 20,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.mu = SWAG(num_params, max_rank, dtype=dtype, device=device)
        self.var = MomentCollector(num_params, 0, dtype=dtype, device=device)
        self.rho = MomentCollector(num_params, 0, dtype=dtype, device=device)

    @property
    def n_collected(self) -> int:
        return self.mu.n_collected

    @torch.no_grad()
    def collect(self, mu: torch.Tensor, rho: torch.Tensor) -> None:
        """Add the snapshot N(mu, diag softplus(rho)^2)."""
        self.mu.collect(mu)
        self.var.collect(torch.nn.functional.softplus(rho.detach()) ** 2)
        self.rho.collect(rho)

    def sample(
        self, variant: str = "hwa", scale: float = 0.5, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """One weight vector from the ``hwa``, ``hwa_mf`` or ``hwa_rho`` predictive."""
        if variant not in VARIANTS:
            raise ValueError(
                f"unknown HWA variant {variant!r}; choose one of {', '.join(VARIANTS)}"
            )
        mean = self.mu.mean
        z0 = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        if variant == "hwa_rho":
            return mean + torch.nn.functional.softplus(self.rho.mean) * z0
        spread = ieee.sqrt(self.var.mean.clamp(min=0)) * z0
        if variant == "hwa_mf":
            return mean + spread
        return self.mu.sample(scale=scale, generator=generator) + spread

    def state_dict(self) -> dict[str, Any]:
        return {
            "mu": self.mu.state_dict(),
            "var": self.var.state_dict(),
            "rho": self.rho.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mu.load_state_dict(state["mu"])
        self.var.load_state_dict(state["var"])
        self.rho.load_state_dict(state["rho"])

    @classmethod
    def from_state_dict(
        cls,
        state: dict[str, Any],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> HWA:
        obj = cls(state["mu"]["num_params"], state["mu"]["max_rank"], dtype=dtype, device=device)
        obj.load_state_dict(state)
        return obj
