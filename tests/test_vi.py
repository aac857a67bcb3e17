"""Mean-field VI over a plain module (ALGORITHMS §3)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bayesavg.posteriors import MeanFieldVI, gaussian_kl, svi_step
from bayesavg.posteriors.vi import inverse_softplus


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


def test_closed_form_kl_matches_monte_carlo() -> None:
    gen = torch.Generator().manual_seed(0)
    mu = torch.randn(5, generator=gen)
    sigma = torch.rand(5, generator=gen) + 0.2
    prior = 1.5
    n = 400_000
    w = mu + sigma * torch.randn(n, 5, generator=gen, dtype=torch.float64)
    log_q = (-0.5 * ((w - mu) / sigma) ** 2 - torch.log(sigma) - 0.5 * math.log(2 * math.pi)).sum(1)
    log_p = (-0.5 * (w / prior) ** 2 - math.log(prior) - 0.5 * math.log(2 * math.pi)).sum(1)
    diff = log_q - log_p
    mc, stderr = diff.mean(), diff.std() / math.sqrt(n)
    assert abs(gaussian_kl(mu, sigma, prior).double() - mc) < 5 * stderr


def test_kl_is_summed_over_all_weights() -> None:
    mu, sigma = torch.zeros(10), torch.full((10,), 0.5)
    one = gaussian_kl(mu[:1], sigma[:1], 1.0)
    assert torch.allclose(gaussian_kl(mu, sigma, 1.0), 10 * one)


def test_inverse_softplus() -> None:
    for sigma in (1e-6, 1e-3, 0.5, 3.0):
        rho = torch.tensor(inverse_softplus(sigma), dtype=torch.float64)
        assert torch.nn.functional.softplus(rho).item() == pytest.approx(sigma, rel=1e-6)


def test_tiny_sigma_predicts_like_the_deterministic_model() -> None:
    net = _net()
    x = torch.randn(8, 4)
    expected = net(x)
    vi = MeanFieldVI(net, sigma_init=1e-8)
    sample = vi(x, vi.theta(torch.randn_like(vi.mu)))
    assert torch.allclose(vi(x), expected, atol=1e-6)
    assert torch.allclose(sample, expected, atol=1e-5)


def test_svi_step_gradient_is_the_negative_elbo_gradient() -> None:
    net = _net()
    vi = MeanFieldVI(net, sigma_init=0.05, prior_sigma=1.0)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    torch.manual_seed(5)
    loss, _ = svi_step(n_train=100, kl_weight=1.0)(vi, x, y)
    got = (vi.mu.grad.clone(), vi.rho.grad.clone())
    vi.zero_grad()
    torch.manual_seed(5)
    theta = vi.theta(torch.randn_like(vi.mu))
    ref = nn.functional.cross_entropy(vi(x, theta), y) + vi.kl() / 100
    ref.backward()
    assert torch.allclose(loss, ref.detach())
    assert torch.allclose(got[0], vi.mu.grad)
    assert torch.allclose(got[1], vi.rho.grad)
    assert all(p.grad is None for p in net.parameters())


def test_f_vi_uses_the_same_eps_in_both_passes() -> None:
    """With a vanishing SAM radius, F-VI's gradient equals plain SVI's for the same eps."""
    vi_a, vi_b = MeanFieldVI(_net(), 0.05), MeanFieldVI(_net(), 0.05)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    torch.manual_seed(9)
    svi_step(100, sam_rho=1e-9)(vi_a, x, y)
    torch.manual_seed(9)
    svi_step(100)(vi_b, x, y)
    assert torch.allclose(vi_a.mu.grad, vi_b.mu.grad, atol=1e-5)
    assert torch.allclose(vi_a.rho.grad, vi_b.rho.grad, atol=1e-5)


def test_f_vi_second_pass_leaves_batchnorm_statistics_alone() -> None:
    """With BatchNorm, F-VI's perturbed pass must neither move the running statistics
    nor break backward (batch norm's backward keeps the statistics it was given)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))
    vi = MeanFieldVI(net, 0.05)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    torch.manual_seed(9)
    svi_step(100, sam_rho=0.05)(vi, x, y)
    after_sam = {k: v.clone() for k, v in net.named_buffers()}
    assert vi.mu.grad is not None and torch.isfinite(vi.mu.grad).all()
    torch.manual_seed(0)
    fresh = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))
    one_pass = MeanFieldVI(fresh, 0.05)
    torch.manual_seed(9)
    theta = one_pass.theta(torch.randn_like(one_pass.mu))
    one_pass(x, theta.detach())  # the first pass alone: the statistics F-VI must end with
    for name, value in fresh.named_buffers():
        assert torch.equal(after_sam[name], value), name
