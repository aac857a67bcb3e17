"""Sharpness of the training loss at a weight vector (ALGORITHMS §5, "Report").

Two measures at the centre of a posterior: the SAM estimate of the worst
loss increase within an L2 ball of radius r (one ascent step), and the
trace of the Hessian by Hutchinson's estimator with Rademacher probes
(Hessian-vector products by double backprop). Both use the model in eval
mode, so BatchNorm uses its running statistics and the loss is a fixed
function of the weights.
"""

from __future__ import annotations

import torch
from torch import nn

from ..data.inputs import Input


def _loss(model: nn.Module, x: Input, y: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Mean cross-entropy over (x, y), differentiable in the parameters."""
    total = torch.zeros((), device=x.device)
    for start in range(0, x.shape[0], batch_size):
        logits = model(x[start : start + batch_size])
        total = total + nn.functional.cross_entropy(
            logits, y[start : start + batch_size], reduction="sum"
        )
    return total / x.shape[0]


def sam_sharpness(
    model: nn.Module, x: Input, y: torch.Tensor, rho: float, batch_size: int = 1000
) -> float:
    """L(theta + rho g/||g||) - L(theta): the one-step estimate of the worst increase."""
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    loss = _loss(model, x, y, batch_size)
    grads = torch.autograd.grad(loss, params)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    eps = [rho * g / (norm + 1e-12) for g in grads]
    with torch.no_grad():
        for p, e in zip(params, eps, strict=True):
            p.add_(e)
        perturbed = _loss(model, x, y, batch_size)
        for p, e in zip(params, eps, strict=True):
            p.sub_(e)
    return (perturbed - loss.detach()).item()


def hessian_trace(
    model: nn.Module,
    x: Input,
    y: torch.Tensor,
    probes: int,
    generator: torch.Generator,
    batch_size: int = 1000,
) -> float:
    """Hutchinson's estimate of tr(H) = E[v^T H v], v Rademacher, averaged over probes."""
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(_loss(model, x, y, batch_size), params, create_graph=True)
    estimates = []
    for i in range(probes):
        vs = [
            (torch.randint(0, 2, p.shape, generator=generator, device=p.device) * 2 - 1).to(p.dtype)
            for p in params
        ]
        # H v as the gradient of g . v: the same product as grad(grads, grad_outputs=vs),
        # without the grad_outputs shape check that imports sympy (0.5 s) on first use.
        dot = sum((g * v).sum() for g, v in zip(grads, vs, strict=True))
        hv = torch.autograd.grad(dot, params, retain_graph=i < probes - 1)
        estimates.append(sum((h * v).sum() for h, v in zip(hv, vs, strict=True)))
    return torch.stack(estimates).mean().item()
