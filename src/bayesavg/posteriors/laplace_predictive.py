"""The last-layer Laplace's probit predictive through a network.

The layer's inputs are caught by a forward hook while the network runs as it is, then
the closed-form GLM predictive is computed from them (``LastLayerLaplace.log_probs``).
The evaluation's sampler and the laplace trajectory's validation row both predict so,
which keeps the row's validation NLL the one the evaluate stage would report.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..data.inputs import Input
from .last_layer_laplace import LastLayerLaplace


@torch.inference_mode()
def layer_inputs(model: nn.Module, layer: str, x: Input, batch_size: int) -> Tensor:
    """float32 (N, D): what ``layer`` receives for every input, the network run in
    batches of ``batch_size`` in its current mode."""
    found: list[Tensor] = []
    module = model.get_submodule(layer)
    hook = module.register_forward_hook(lambda m, inp, out: found.append(inp[0].float()))
    try:
        for i in range(0, x.shape[0], batch_size):
            model(x[i : i + batch_size])
    finally:
        hook.remove()
    return torch.cat(found)


@torch.inference_mode()
def probit_log_probs(
    la: LastLayerLaplace, model: nn.Module, layer: str, x: Input, batch_size: int
) -> Tensor:
    """float64 (N, C) log probabilities of the probit predictive at every input."""
    return la.log_probs(layer_inputs(model, layer, x, batch_size), "probit")
