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

from ..data.inputs import Input

_BN = nn.modules.batchnorm._BatchNorm


def bn_modules(model: nn.Module) -> list[_BN]:
    return [m for m in model.modules() if isinstance(m, _BN) and m.track_running_stats]


def _batches(n: int, batch_size: int) -> list[tuple[int, int]]:
    """Batch bounds; a last batch of one point joins the previous one (BN needs >= 2)."""
    bounds = [(start, min(start + batch_size, n)) for start in range(0, n, batch_size)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


class _Moments:
    """float64 sums over batches of n, n * mean and n * (biased variance + mean^2) of BN
    layers' per-batch statistics, as flat vectors over all their channels.

    One ``cat`` and a handful of vector ops per batch, whatever the depth: per layer
    (about eight ops each) a PreResNet-164 spends more time launching these tiny
    kernels than computing them. The arithmetic is the per-layer formula's, element by
    element, so the bytes are those of a loop over layers.
    """

    def __init__(self) -> None:
        self.sums: dict[tuple[_BN, ...], list[torch.Tensor]] = {}
        self._counts: dict[tuple[tuple[_BN, int], ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def _weights(self, seen: tuple[tuple[_BN, int], ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per channel: n, and (n - 1) / n; built once per batch shape (a host-to-device
        copy), on the device of the statistics."""
        if seen not in self._counts:
            device = seen[0][0].running_mean.device
            channels = [(m.running_mean.numel(), n) for m, n in seen]
            ns = [float(n) for size, n in channels for _ in range(size)]
            factors = [(n - 1) / n for size, n in channels for _ in range(size)]
            self._counts[seen] = (
                torch.tensor(ns, dtype=torch.float64, device=device),
                torch.tensor(factors, dtype=torch.float64, device=device),
            )
        return self._counts[seen]

    def add(self, seen: dict[_BN, int]) -> None:
        """Fold the running stats of the layers in ``seen`` (layer: elements per channel of
        its input, in call order), as momentum 1 left them, into the sums."""
        if not seen:
            return
        key = tuple(seen.items())
        n, factor = self._weights(key)
        layers = tuple(seen)
        mean = torch.cat([m.running_mean for m in layers]).double()
        second = torch.cat([m.running_var for m in layers]).double() * factor + mean * mean
        acc = self.sums.setdefault(layers, [torch.zeros_like(n)] * 3)
        acc[0] = acc[0] + n
        acc[1] = acc[1] + n * mean
        acc[2] = acc[2] + n * second
        seen.clear()

    def write(self) -> None:
        """Each layer's full-data mean and unbiased variance into its running stats."""
        for layers, (count, s1, s2) in self.sums.items():
            mean = s1 / count
            var = (s2 / count - mean * mean).clamp(min=0) * (count / (count - 1).clamp(min=1))
            sizes = [m.running_mean.numel() for m in layers]
            torch._foreach_copy_([m.running_mean for m in layers], list(mean.split(sizes)))
            torch._foreach_copy_([m.running_var for m in layers], list(var.split(sizes)))
            torch._foreach_add_([m.num_batches_tracked for m in layers], 1)


@torch.no_grad()
def update_bn(model: nn.Module, x: Input, batch_size: int = 1000) -> None:
    """Set every BN layer's running stats to its input's full-data mean and variance.

    The forward pass runs in train mode (each layer normalises with batch
    statistics, as during training). With momentum 1 each layer's running
    stats are exactly the current batch's; after each batch they are folded
    into float64 sums of x and x^2 weighted by the batch's element count
    (``_Moments``): no extra pass over the activations. A layer called twice
    in one forward (a shared module) is folded before its second call. Every
    module's mode and momentum are restored; a BN layer the forward pass never
    reaches keeps its stats.
    """
    layers = bn_modules(model)
    if not layers:
        return
    moments = _Moments()
    seen: dict[_BN, int] = {}

    def before(module: _BN, inputs: tuple[torch.Tensor, ...]) -> None:
        if module in seen:
            moments.add(seen)

    def after(module: _BN, inputs: tuple[torch.Tensor, ...], _: torch.Tensor) -> None:
        seen[module] = inputs[0].numel() // inputs[0].shape[1]

    handles = [m.register_forward_pre_hook(before) for m in layers]
    handles += [m.register_forward_hook(after) for m in layers]
    modes = {m: m.training for m in model.modules()}
    momenta = {m: m.momentum for m in layers}
    tracked = {m: m.num_batches_tracked.clone() for m in layers}
    try:
        model.train()
        for m in layers:
            m.momentum = 1.0
        for start, stop in _batches(x.shape[0], batch_size):
            model(x[start:stop])
            moments.add(seen)
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.training = training
        for m in layers:
            m.momentum = momenta[m]
            m.num_batches_tracked.copy_(tracked[m])
    moments.write()
