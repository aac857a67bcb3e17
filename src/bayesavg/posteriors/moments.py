"""Running first/second moments and the last-K deviation matrix of flat vectors.

This is the one collector behind SWA, SWAG, HWA and DSWAG. Moments are kept
in float64 with Welford's update: the float32 ``sq_mean - mean**2`` of the
reference SWAG code cancels catastrophically once weights settle.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..training.flat import params_vector


def as_vector(theta: torch.Tensor | nn.Module) -> torch.Tensor:
    """A module's parameters in ``parameters_to_vector`` order, or a 1-D tensor as is."""
    if isinstance(theta, nn.Module):
        return params_vector(theta.parameters()).detach()
    if theta.dim() != 1:
        raise ValueError(f"expected a 1-D parameter vector, got shape {tuple(theta.shape)}")
    return theta.detach()


class MomentCollector:
    """Mean, second moment and the last ``max_rank`` deviations of collected vectors.

    ``deviations`` row i is ``theta_i - mean`` with the mean taken right after
    ``theta_i`` was added (ALGORITHMS §2), oldest row first.
    """

    def __init__(
        self,
        num_params: int,
        max_rank: int = 20,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_params < 1:
            raise ValueError(f"num_params must be >= 1, got {num_params}")
        if max_rank < 0:
            raise ValueError(f"max_rank must be >= 0, got {max_rank}")
        self.num_params = num_params
        self.max_rank = max_rank
        self.dtype = dtype
        self.device = torch.device(device)
        self.n_collected = 0
        self._mean = torch.zeros(num_params, dtype=torch.float64, device=self.device)
        self._m2 = torch.zeros(num_params, dtype=torch.float64, device=self.device)
        self._ring = torch.zeros(max_rank, num_params, dtype=dtype, device=self.device)

    @torch.no_grad()
    def collect(self, theta: torch.Tensor | nn.Module) -> None:
        """Add one snapshot (a 1-D vector or a module's parameters)."""
        vec = as_vector(theta)
        if vec.numel() != self.num_params:
            raise ValueError(f"expected {self.num_params} parameters, got {vec.numel()}")
        vec = vec.to(device=self.device, dtype=torch.float64)
        self.n_collected += 1
        delta = vec - self._mean
        self._mean.add_(delta / self.n_collected)
        self._m2.addcmul_(delta, vec - self._mean)
        if self.max_rank:
            slot = (self.n_collected - 1) % self.max_rank
            self._ring[slot] = (vec - self._mean).to(self.dtype)

    @property
    def mean(self) -> torch.Tensor:
        return self._mean.to(self.dtype, copy=True)

    @property
    def sq_mean(self) -> torch.Tensor:
        return self._sq_mean64().to(self.dtype)

    def _sq_mean64(self) -> torch.Tensor:
        if self.n_collected == 0:
            return torch.zeros_like(self._mean)
        return self._m2 / self.n_collected + self._mean**2

    @property
    def rank(self) -> int:
        """k = min(n_collected, max_rank): rows in ``deviations``."""
        return min(self.n_collected, self.max_rank)

    @property
    def deviations(self) -> torch.Tensor:
        """(k, d) deviations, oldest first: to read, not to edit (until more than
        ``max_rank`` are collected it is the collector's own storage, not a copy, which
        would double the memory of a large rank-k posterior)."""
        k = self.rank
        if self.n_collected <= self.max_rank or self.max_rank == 0:
            return self._ring[:k]
        head = self.n_collected % self.max_rank
        return torch.cat([self._ring[head:], self._ring[:head]])

    def variance(self) -> torch.Tensor:
        """clamp(sq_mean - mean**2, min=1e-30), computed without cancellation."""
        var = self._m2 / max(self.n_collected, 1)
        return var.clamp(min=1e-30).to(self.dtype)

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors and ints only, so ``torch.load(weights_only=True)`` reads it; each
        a host copy made once (``.cpu().clone()`` copied CUDA tensors twice)."""
        return {
            "num_params": self.num_params,
            "max_rank": self.max_rank,
            "n_collected": self.n_collected,
            "mean": self._mean.to("cpu", copy=True),
            "m2": self._m2.to("cpu", copy=True),
            "deviations": self.deviations.to("cpu", copy=True),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_params"] != self.num_params or state["max_rank"] != self.max_rank:
            raise ValueError(
                f"state has num_params={state['num_params']}, max_rank={state['max_rank']}; "
                f"this collector has {self.num_params}, {self.max_rank}"
            )
        self.n_collected = int(state["n_collected"])
        self._mean = state["mean"].to(device=self.device, dtype=torch.float64).clone()
        self._m2 = state["m2"].to(device=self.device, dtype=torch.float64).clone()
        self._ring.zero_()
        devs = state["deviations"].to(device=self.device, dtype=self.dtype)
        self._ring[: devs.shape[0]] = devs
        if 0 < self.max_rank < self.n_collected:
            # Stored oldest first: put the oldest row where the next write goes.
            head = self.n_collected % self.max_rank
            self._ring = torch.roll(self._ring, shifts=head, dims=0)

    @classmethod
    def from_state_dict(
        cls,
        state: dict[str, Any],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> MomentCollector:
        obj = cls(state["num_params"], state["max_rank"], dtype=dtype, device=device)
        obj.load_state_dict(state)
        return obj
