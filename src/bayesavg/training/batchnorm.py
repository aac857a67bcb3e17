"""Exact BatchNorm statistics after sampling weights (ALGORITHMS §6).

``torch.optim.swa_utils.update_bn`` averages per-batch statistics with equal
weights (biased when the last batch is short) and averages per-batch
variances, which drops the spread of the batch means. Here each batch's
mean and second moment are combined in float64, weighted by batch size, so
the running mean and (unbiased) variance equal those of the full data.
"""

from __future__ import annotations

import torch
from torch import nn

_BN = nn.modules.batchnorm._BatchNorm


def bn_modules(model: nn.Module) -> list[_BN]:
    return [m for m in model.modules() if isinstance(m, _BN) and m.track_running_stats]


def _batches(n: int, batch_size: int) -> list[tuple[int, int]]:
    """Batch bounds; a last batch of one point joins the previous one (BN needs >= 2)."""
    bounds = [(start, min(start + batch_size, n)) for start in range(0, n, batch_size)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


@torch.no_grad()
def update_bn(model: nn.Module, x: torch.Tensor, batch_size: int = 1000) -> None:
    """Set every BN layer's running stats to its input's full-data mean and variance.

    The forward pass runs in train mode (each layer normalises with batch
    statistics, as during training). With momentum 1 each layer's running
    stats are exactly the current batch's, which a hook folds into float64
    sums of x and x^2 weighted by the batch's element count: no extra pass
    over the activations. Every module's mode and momentum are restored; a
    BN layer the forward pass never reaches keeps its stats.
    """
    layers = bn_modules(model)
    if not layers:
        return
    sums: dict[_BN, list[torch.Tensor | int]] = {}

    def hook(module: _BN, inputs: tuple[torch.Tensor, ...], _: torch.Tensor) -> None:
        n = inputs[0].numel() // inputs[0].shape[1]
        mean = module.running_mean.double()
        second = module.running_var.double() * ((n - 1) / n) + mean * mean
        acc = sums.setdefault(module, [0, 0.0, 0.0])
        acc[0] += n
        acc[1] = acc[1] + n * mean
        acc[2] = acc[2] + n * second

    handles = [m.register_forward_hook(hook) for m in layers]
    modes = {m: m.training for m in model.modules()}
    momenta = {m: m.momentum for m in layers}
    tracked = {m: m.num_batches_tracked.clone() for m in layers}
    try:
        model.train()
        for m in layers:
            m.momentum = 1.0
        for start, stop in _batches(x.shape[0], batch_size):
            model(x[start:stop])
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.training = training
        for m in layers:
            m.momentum = momenta[m]
            m.num_batches_tracked.copy_(tracked[m])
    for module, (count, s1, s2) in sums.items():
        mean = s1 / count
        var = (s2 / count - mean * mean).clamp(min=0) * (count / max(count - 1, 1))
        module.running_mean.copy_(mean)
        module.running_var.copy_(var)
        module.num_batches_tracked.add_(1)
