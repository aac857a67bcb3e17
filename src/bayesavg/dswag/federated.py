"""Pure building blocks of distributed SWAG (ALGORITHMS §8): shards, sampling, rates, weights.

Everything here is a deterministic function of its arguments and a seed
(never of global RNG state or of how many processes run the clients), so
that each process can recompute any client's shard or any round's sample by
itself and 50 clients give the same result on 1, 2 or 8 processes.

A shard is a sorted 1-D int64 tensor of example indices: sorting makes it
depend only on which examples a client holds, not on the order they were drawn.
"""

from __future__ import annotations

import numpy as np
import torch

from ..runtime.errors import UserError
from ..seeding import derive_seed, generator

DIRICHLET_ATTEMPTS = 100
"""Draws ``dirichlet_split`` tries before it reports that ``min_size`` cannot be met."""


def _check_labels(labels: torch.Tensor, clients: int) -> int:
    """The number of examples; a params error if there are fewer examples than clients."""
    if labels.dim() != 1:
        raise ValueError(f"labels must be 1-D, got shape {tuple(labels.shape)}")
    if clients < 1:
        raise UserError(f"clients: {clients} must be at least 1")
    n = labels.numel()
    if clients > n:
        raise UserError(
            f"clients: {clients} is more than the {n} training examples; "
            f"use at most {n} clients so that none is empty"
        )
    return n


def iid_split(labels: torch.Tensor, clients: int, seed: int) -> list[torch.Tensor]:
    """``clients`` disjoint shards covering every index once, sizes within one of each other.

    A seeded permutation cut into contiguous pieces (the first ``n % clients``
    one longer); only ``labels``' length is used.
    """
    n = _check_labels(labels, clients)
    perm = torch.randperm(n, generator=generator(derive_seed(seed, "iid_split")))
    sizes = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
    return [torch.sort(part).values for part in torch.split(perm, sizes)]


def dirichlet_split(
    labels: torch.Tensor, clients: int, alpha: float, min_size: int, seed: int
) -> list[torch.Tensor]:
    """Non-IID shards: each class's examples shared out by proportions ~ Dirichlet(alpha).

    Small ``alpha`` gives each client few classes; large ``alpha`` (1e4) is
    near IID. For each class (ascending label), its indices are shuffled and
    cut at ``rint(cumsum(p) * n_c)``, ``p`` drawn over the clients (rounding,
    unlike flooring, gives the first and last client no systematic -1/+1).

    Rule for ``min_size`` (every shard must hold at least that many examples):
    ``min_size * clients > n`` can never be met and is a params error at once;
    otherwise a draw leaving any shard smaller is redrawn with the next derived
    seed (attempt 0, 1, ...), and after ``DIRICHLET_ATTEMPTS`` failed draws it
    is a params error too. So the result is a function of the arguments, and
    the function always ends.
    """
    n = _check_labels(labels, clients)
    if not (alpha > 0 and np.isfinite(alpha)):
        raise UserError(f"alpha: {alpha} must be a positive number (small: skewed, 1e4: ~IID)")
    if min_size < 0:
        raise UserError(f"min_size: {min_size} must be at least 0")
    if min_size * clients > n:
        raise UserError(
            f"min_size: {min_size} x {clients} clients needs {min_size * clients} examples "
            f"but there are {n}; use min_size <= {n // clients} or fewer clients"
        )
    y = labels.detach().cpu().numpy()
    by_class = [np.flatnonzero(y == c) for c in np.unique(y)]
    for attempt in range(DIRICHLET_ATTEMPTS):
        rng = np.random.default_rng(derive_seed(seed, "dirichlet_split", attempt))
        pieces: list[list[np.ndarray]] = [[] for _ in range(clients)]
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(clients, float(alpha)))
            cuts = np.rint(np.cumsum(p)[:-1] * idx.size).astype(np.int64)
            for i, part in enumerate(np.split(idx, np.minimum(cuts, idx.size))):
                pieces[i].append(part)
        sizes = [sum(part.size for part in client) for client in pieces]
        if min(sizes) >= min_size:
            return [
                torch.sort(torch.from_numpy(np.concatenate(client)).long()).values
                for client in pieces
            ]
    raise UserError(
        f"min_size: could not draw {clients} Dirichlet(alpha={alpha}) shards of at least "
        f"{min_size} examples in {DIRICHLET_ATTEMPTS} attempts; lower min_size or raise alpha"
    )


def sample_clients(clients: int, fraction: float, seed: int, round_: int) -> list[int]:
    """The ids (ascending) of the k = max(1, round(fraction * clients)) clients of a round.

    Without replacement, seeded by (seed, round) so any process recomputes
    the same sample. ``round`` is Python's (half to even): 0.5 of 5 gives 2.
    """
    if clients < 1:
        raise UserError(f"clients: {clients} must be at least 1")
    if not 0 < fraction <= 1:
        raise UserError(f"fraction: {fraction} must be in (0, 1]")
    k = max(1, round(fraction * clients))
    perm = torch.randperm(clients, generator=generator(derive_seed(seed, "clients", round_)))
    return sorted(perm[:k].tolist())


def phase2_rate(epoch: int, epochs: int, lr_start: float, lr_end: float) -> float:
    """DSWAG's phase-2 rate alpha(t) = (1 - t/c) alpha_1 + (t/c) alpha_2, t = epoch, c = epochs.

    ``epoch`` is 0-based, so the first epoch runs at ``lr_start`` and the last
    at one step short of ``lr_end`` (as the paper writes it).
    """
    if epochs < 1 or not 0 <= epoch < epochs:
        raise ValueError(f"epoch {epoch} is not in 0..{epochs - 1}")
    t = epoch / epochs
    return (1 - t) * lr_start + t * lr_end


def fedavg_weights(sizes: list[int]) -> list[float]:
    """FedAvg's weights n_i / sum(n) (float64) over the clients that took part in a round."""
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"client sizes must be positive and non-empty, got {sizes}")
    total = sum(sizes)
    return [s / total for s in sizes]
