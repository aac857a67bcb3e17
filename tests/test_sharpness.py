"""Sharpness measures against brute force on a model whose Hessian is known."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, hessian

from bayesavg.evaluation.sharpness import hessian_trace, sam_sharpness


def _setup() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    return model, torch.randn(20, 3, dtype=torch.float64), torch.randint(0, 2, (20,))


def _full_hessian(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    names = [n for n, _ in model.named_parameters()]
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    shapes = [p.shape for p in model.parameters()]

    def loss(vec: torch.Tensor) -> torch.Tensor:
        params, offset = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            n = shape.numel()
            params[name] = vec[offset : offset + n].view(shape)
            offset += n
        return nn.functional.cross_entropy(functional_call(model, params, (x,)), y)

    return hessian(loss)(flat)


def test_hutchinson_converges_to_the_exact_trace() -> None:
    model, x, y = _setup()
    exact = torch.trace(_full_hessian(model, x, y)).item()
    gen = torch.Generator().manual_seed(0)
    estimate = hessian_trace(model, x, y, probes=400, generator=gen, batch_size=7)
    # Rademacher variance: 2 * sum_{i != j} H_ij^2; allow 5 standard errors.
    h = _full_hessian(model, x, y)
    stderr = (2 * ((h**2).sum() - (h.diag() ** 2).sum()) / 400).sqrt().item()
    assert abs(estimate - exact) < 5 * stderr + 1e-9


def test_sam_sharpness_matches_the_definition_and_restores_weights() -> None:
    model, x, y = _setup()
    before = [p.detach().clone() for p in model.parameters()]
    got = sam_sharpness(model, x, y, rho=0.1, batch_size=6)
    loss = nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads, strict=True):
            p.add_(0.1 * g / norm)
        expected = (nn.functional.cross_entropy(model(x), y) - loss).item()
        for p, g in zip(model.parameters(), grads, strict=True):
            p.sub_(0.1 * g / norm)
    assert abs(got - expected) < 1e-10
    assert got > 0
    assert all(torch.allclose(a, b) for a, b in zip(before, model.parameters(), strict=True))
