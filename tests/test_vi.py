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


def _blr_problem() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bayesian linear regression with correlated features: data, and the exact answers."""
    gen = torch.Generator().manual_seed(0)
    mixing = torch.tensor(
        [[1.0, 0.6, 0.0, 0.0], [0.0, 0.8, 0.5, 0.0], [0.0, 0.0, 1.5, 0.3], [0.0, 0.0, 0.0, 0.3]]
    )
    x = torch.randn(400, 4, generator=gen) @ mixing
    y = x @ torch.randn(4, generator=gen) + BLR_NOISE * torch.randn(400, generator=gen)
    x64, y64 = x.double(), y.double()
    precision = x64.T @ x64 / BLR_NOISE**2 + torch.eye(4, dtype=torch.float64) / BLR_PRIOR**2
    mean = torch.linalg.solve(precision, x64.T @ y64 / BLR_NOISE**2)
    sigma_mean_field = precision.diagonal().rsqrt()  # the mean-field optimum: 1 / Lambda_ii
    sigma_marginal = torch.linalg.inv(precision).diagonal().sqrt()  # the true posterior's
    return x, y, mean, sigma_mean_field, sigma_marginal


BLR_NOISE, BLR_PRIOR = 0.5, 1.0


def _fit_blr(x: torch.Tensor, y: torch.Tensor, optimizer: str) -> MeanFieldVI:
    """SVI as a vi trajectory runs it (MeanFieldVI, svi_step, the loop's optimizer and
    cosine schedule), with a Gaussian likelihood, from sigma_0 = 0.003."""
    from bayesavg.training.batches import Tensors
    from bayesavg.training.optim import build
    from bayesavg.training.schedules import lr_at
    from bayesavg.training.train import train

    def gaussian_nll(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((out.squeeze(1) - target) / BLR_NOISE).pow(2).mean()

    torch.manual_seed(1)
    vi = MeanFieldVI(nn.Linear(4, 1, bias=False), sigma_init=0.003, prior_sigma=BLR_PRIOR)
    epochs, batch = 600, 100
    train(
        vi,
        build(optimizer, [vi.mu, vi.rho], momentum=0.9 if optimizer == "sgd" else 0.0),
        Tensors(x, y),
        epochs=epochs,
        batch_size=batch,
        lr=lr_at("cosine", 0.03, 1e-5, 1, epochs * len(y) // batch),
        generator=torch.Generator().manual_seed(2),
        step=svi_step(len(y), mc_samples=4, likelihood=gaussian_nll),
    )
    return vi


def test_svi_reaches_the_mean_field_optimum_of_bayesian_linear_regression() -> None:
    """Known answer: the mean-field optimum is the exact posterior mean, sigma_i^2 = 1/Lambda_ii.

    Tolerance: every sigma within 6% of its optimum, every mean within 0.1 of
    its optimal sigma. The marginal posterior's sigma differs from the
    mean-field one by far more than 6% here, so the check tells them apart.
    """
    x, y, mean, sigma_mf, sigma_marginal = _blr_problem()
    assert ((sigma_marginal / sigma_mf) - 1).max() > 0.3
    vi = _fit_blr(x, y, "adam")
    sigma, mu = vi.sigma.detach().double(), vi.mu.detach().double()
    assert ((sigma / sigma_mf) - 1).abs().max() < 0.06, (sigma, sigma_mf)
    assert ((mu - mean).abs() / sigma_mf).max() < 0.1, (mu, mean)


def test_plain_sgd_does_not_reach_it() -> None:
    """Why vi trajectories use Adam: with SGD the gradient on rho is scaled by
    sigmoid(rho) ~ sigma, and the same run stops far short of the optimum."""
    x, y, _, sigma_mf, _ = _blr_problem()
    sigma = _fit_blr(x, y, "sgd").sigma.detach().double()
    assert ((sigma / sigma_mf) - 1).abs().max() > 0.5, (sigma, sigma_mf)


def test_an_overflowing_fp16_gradient_gives_f_vi_no_ascent() -> None:
    """F-VI's ascent under fp16's loss scaler: an overflowing probe gradient must not put
    inf or NaN into the perturbed network (the loss stays finite; the scaler skips)."""
    from bayesavg.posteriors.vi import svi_step
    from bayesavg.training.steps import StepContext

    torch.manual_seed(0)
    vi = MeanFieldVI(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)), 0.01)
    x, y = torch.randn(16, 5) * 1e3, torch.randint(0, 3, (16,))  # scaled gradients overflow
    ctx = StepContext()
    ctx.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)
    loss, logits = svi_step(n_train=100, sam_rho=0.05)(vi, x, y, ctx)
    assert bool(torch.isfinite(loss)) and bool(torch.isfinite(logits).all())
