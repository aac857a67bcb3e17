"""Learning rates as plain functions of the iteration, for every trajectory kind.

The cyclic SWA schedule (linear within each cycle) and the SWAG paper's CIFAR
schedule are not in ``torch.optim.swa_utils``, whose SWALR is epoch-based and
anneals differently.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def swag_factor(t: float, ratio: float) -> float:
    """The SWAG paper's CIFAR schedule (reference ``run_swag.py``) as a fraction of lr."""
    if t <= 0.5:
        return 1.0
    if t <= 0.9:
        return 1.0 - (1.0 - ratio) * (t - 0.5) / 0.4
    return ratio


def lr_at(
    kind: str,
    lr: float,
    lr_end: float,
    cycle_length: int,
    total_iters: int,
    iters_per_epoch: int = 1,
    decay_epochs: int | None = None,
) -> Callable[[int], float]:
    """Learning rate for 0-based iteration i.

    cosine: lr -> lr_end over ``total_iters``; constant: lr; cyclic: the SWA
    paper's alpha(i) = (1 - t) lr + t lr_end, t = ((i mod c) + 1) / c, so the
    last iteration of each cycle runs at lr_end; swag: per epoch e = i //
    ``iters_per_epoch``, ``swag_factor(e / decay_epochs, lr_end / lr)`` times lr
    (``decay_epochs`` defaults to the run's epochs).
    """
    if kind == "constant":
        return lambda i: lr
    if kind == "cosine":
        span = max(total_iters - 1, 1)
        return lambda i: (
            lr_end + (lr - lr_end) * 0.5 * (1 + math.cos(math.pi * min(i, span) / span))
        )
    if kind == "cyclic":

        def cyclic(i: int) -> float:
            t = ((i % cycle_length) + 1) / cycle_length
            return (1 - t) * lr + t * lr_end

        return cyclic
    if kind == "swag":
        per_epoch = max(iters_per_epoch, 1)
        span = decay_epochs or max(math.ceil(total_iters / per_epoch), 1)
        return lambda i: lr * swag_factor((i // per_epoch) / span, lr_end / lr)
    raise ValueError(f"unknown schedule {kind!r}")
