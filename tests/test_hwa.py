"""HWA moments and sampling against brute force (ALGORITHMS §4)."""

from __future__ import annotations

import math

import torch

from bayesavg.posteriors import HWA


def _snapshots(n: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    mus = torch.randn(n, d, generator=gen, dtype=torch.float64)
    rhos = torch.randn(n, d, generator=gen, dtype=torch.float64) - 2
    return mus, rhos


def test_moments_and_deviations_against_brute_force() -> None:
    mus, rhos = _snapshots(7, 5)
    hwa = HWA(5, max_rank=4, dtype=torch.float64)
    for mu, rho in zip(mus, rhos, strict=True):
        hwa.collect(mu, rho)
    sig2 = torch.nn.functional.softplus(rhos) ** 2
    assert torch.allclose(hwa.mu.mean, mus.mean(0))
    assert torch.allclose(hwa.mu.sq_mean, (mus**2).mean(0))
    assert torch.allclose(hwa.var.mean, sig2.mean(0))
    assert torch.allclose(hwa.rho.mean, rhos.mean(0))
    running = torch.cumsum(mus, 0) / torch.arange(1, 8, dtype=torch.float64)[:, None]
    assert torch.allclose(hwa.mu.deviations, (mus - running)[-4:])


def _cov(samples: torch.Tensor) -> torch.Tensor:
    centred = samples - samples.mean(0)
    return centred.T @ centred / (samples.shape[0] - 1)


def test_sample_covariances() -> None:
    """hwa: diag(v) + scale (diag var_mu + D^T D / (k-1)); hwa_mf: diag(v);
    hwa_rho: diag(softplus(mean rho)^2)."""
    mus, rhos = _snapshots(4, 4)
    hwa = HWA(4, max_rank=20, dtype=torch.float64)
    for mu, rho in zip(mus, rhos, strict=True):
        hwa.collect(mu, rho)
    gen = torch.Generator().manual_seed(1)
    n, scale = 15_000, 0.5
    v = hwa.var.mean
    dev = hwa.mu.deviations
    expected = {
        "hwa": torch.diag(v) + scale * (torch.diag(hwa.mu.variance()) + dev.T @ dev / 3),
        "hwa_mf": torch.diag(v),
        "hwa_rho": torch.diag(torch.nn.functional.softplus(hwa.rho.mean) ** 2),
    }
    for method, sigma in expected.items():
        draws = torch.stack([hwa.sample(method, scale, gen) for _ in range(n)])
        tol = 6 * torch.sqrt((torch.outer(sigma.diag(), sigma.diag()) + sigma**2) / n)
        assert ((_cov(draws) - sigma).abs() <= tol).all(), method
        assert ((draws.mean(0) - hwa.mu.mean).abs() <= 6 * sigma.diag().sqrt() / math.sqrt(n)).all()


def test_state_dict_round_trip() -> None:
    mus, rhos = _snapshots(6, 3)
    hwa = HWA(3, max_rank=4)
    for mu, rho in zip(mus, rhos, strict=True):
        hwa.collect(mu.float(), rho.float())
    copy = HWA.from_state_dict(hwa.state_dict())
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(hwa.sample("hwa", 0.5, g1), copy.sample("hwa", 0.5, g2))
    assert copy.n_collected == 6
