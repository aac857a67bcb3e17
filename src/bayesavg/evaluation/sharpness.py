"""Sharpness of the training loss at a weight vector (ALGORITHMS §5, "Report").

Two measures at the centre of a posterior: the SAM estimate of the worst
loss increase within an L2 ball of radius r (one ascent step), and the
trace of the Hessian by Hutchinson's estimator with Rademacher probes
(Hessian-vector products by double backprop). Both use the model in eval
mode, so BatchNorm uses its running statistics and the loss is a fixed
function of the weights.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from ..data.inputs import Input


def _batch_losses(
    model: nn.Module, x: Input, y: torch.Tensor, batch_size: int
) -> Iterator[torch.Tensor]:
    """Each batch's summed cross-entropy, differentiable in the parameters: a caller
    takes what it needs from one batch's graph before the next is built, so memory
    holds one batch's graph, not all ``n_points`` images' at once."""
    for start in range(0, x.shape[0], batch_size):
        logits = model(x[start : start + batch_size])
        yield nn.functional.cross_entropy(logits, y[start : start + batch_size], reduction="sum")


def _loss_and_grad(
    model: nn.Module, params: list[torch.Tensor], x: Input, y: torch.Tensor, batch_size: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Mean cross-entropy over (x, y) and its gradient, a batch at a time. Each batch's
    gradient is that of its share of the mean (its sum over n), exactly what backward
    through the whole sum hands each batch; they are added in batch order."""
    n = x.shape[0]
    total = torch.zeros((), device=x.device)
    grads: list[torch.Tensor] | None = None
    for loss in _batch_losses(model, x, y, batch_size):
        found = list(torch.autograd.grad(loss / n, params))
        grads = found if grads is None else torch._foreach_add(grads, found)
        total = total + loss.detach()
    assert grads is not None, "no points"
    return total / n, grads


def sam_sharpness(
    model: nn.Module, x: Input, y: torch.Tensor, rho: float, batch_size: int = 1000
) -> float:
    """L(theta + rho g/||g||) - L(theta): the one-step estimate of the worst increase."""
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    loss, grads = _loss_and_grad(model, params, x, y, batch_size)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    eps = [rho * g / (norm + 1e-12) for g in grads]
    with torch.no_grad():
        for p, e in zip(params, eps, strict=True):
            p.add_(e)
        perturbed = sum(_batch_losses(model, x, y, batch_size), torch.zeros((), device=x.device))
        for p, e in zip(params, eps, strict=True):
            p.sub_(e)
    return (perturbed / x.shape[0] - loss).item()


def hessian_trace(
    model: nn.Module,
    x: Input,
    y: torch.Tensor,
    probes: int,
    generator: torch.Generator,
    batch_size: int = 1000,
) -> torch.Tensor:
    """v^T H v for each of ``probes`` Rademacher v: Hutchinson's estimates of tr(H) =
    E[v^T H v], whose mean is the estimate and whose spread its Monte Carlo error.

    v^T H v is linear in the loss, so it is summed over batches: per batch, the gradient
    of its share of the mean (with its graph), then H_b v for every probe; that batch's
    graphs are freed before the next. The probes are drawn first, in the order one
    batch would draw them, and kept as int8 (one byte per parameter and probe)."""
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    signs = [
        [
            (torch.randint(0, 2, p.shape, generator=generator, device=p.device) * 2 - 1).to(
                torch.int8
            )
            for p in params
        ]
        for _ in range(probes)
    ]
    n = x.shape[0]
    estimates: list[torch.Tensor] = []
    for b, loss in enumerate(_batch_losses(model, x, y, batch_size)):
        grads = torch.autograd.grad(loss / n, params, create_graph=True)
        for i, sign in enumerate(signs):
            vs = [v.to(p.dtype) for v, p in zip(sign, params, strict=True)]
            # H v as the gradient of g . v: the same product as grad(grads, grad_outputs=vs),
            # without the grad_outputs shape check that imports sympy (0.5 s) on first use.
            dot = sum((g * v).sum() for g, v in zip(grads, vs, strict=True))
            hv = torch.autograd.grad(dot, params, retain_graph=i < probes - 1)
            part = sum((h * v).sum() for h, v in zip(hv, vs, strict=True))
            if b == 0:
                estimates.append(part)
            else:
                estimates[i] = estimates[i] + part
    return torch.stack(estimates).detach()
