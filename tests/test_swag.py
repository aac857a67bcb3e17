"""SWAG moments, deviations and sampling against brute-force float64 formulas (ALGORITHMS §2)."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector
from torch.optim.swa_utils import AveragedModel

from bayesavg.posteriors import SWAG, MomentCollector

SIGMAS = 5.5


def _snapshots(n: int, d: int, seed: int) -> torch.Tensor:
    """Random float32 snapshots with a non-zero offset, so mean and spread both matter."""
    g = torch.Generator().manual_seed(seed)
    offset = torch.linspace(-2.0, 3.0, d)
    return (offset + torch.randn(n, d, generator=g)).float()


def _collected(snaps: torch.Tensor, max_rank: int, cls: type[MomentCollector] = SWAG) -> SWAG:
    """A collector fed with every row of ``snaps`` in order."""
    swag = cls(num_params=snaps.shape[1], max_rank=max_rank)
    for theta in snaps:
        swag.collect(theta)
    return swag


def _brute_force(snaps: torch.Tensor) -> dict[str, torch.Tensor]:
    """Float64 mean, second moment, population variance and all n deviation rows.

    Row i of ``deviations`` is theta_i minus the mean of the first i+1 snapshots.
    """
    x = snaps.double()
    n = x.shape[0]
    mean = x.mean(0)
    running = x.cumsum(0) / torch.arange(1, n + 1, dtype=torch.float64)[:, None]
    return {
        "mean": mean,
        "sq_mean": (x * x).mean(0),
        "var": ((x - mean) ** 2).mean(0).clamp(min=1e-30),
        "deviations": x - running,
    }


def _expected_cov(swag: SWAG, scale: float, divisor: float | None = None) -> torch.Tensor:
    """scale * (diag(var) + D^T D / divisor), from the collector's own float64 moments."""
    var = swag.variance().double()
    devs = swag.deviations.double()
    if divisor is None:
        divisor = swag.rank - 1
    return scale * (torch.diag(var) + devs.T @ devs / divisor)


def _draw(swag: SWAG, n: int, seed: int, **kwargs: object) -> torch.Tensor:
    """n samples (n, d) in float64; sample() draws one vector per call."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([swag.sample(generator=g, **kwargs) for _ in range(n)]).double()


def _cov_tolerance(expected: torch.Tensor, n: int) -> torch.Tensor:
    """SIGMAS standard errors of a sample covariance about a known mean.

    Var(C_ij) = (S_ii S_jj + S_ij^2) / N for Gaussian samples.
    """
    diag = torch.diagonal(expected)
    return SIGMAS * torch.sqrt((diag[:, None] * diag[None, :] + expected**2) / n)


def _sample_cov(samples: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    centred = samples - mean
    return centred.T @ centred / samples.shape[0]


@pytest.mark.parametrize("cls", [SWAG, MomentCollector])
@pytest.mark.parametrize("n", [1, 3, 5, 7, 10, 13])
def test_moments_and_deviations_match_brute_force(cls: type[MomentCollector], n: int) -> None:
    """n < K, n = K and n > K (wrapped ring, head at different slots) against float64."""
    max_rank, d = 5, 8
    snaps = _snapshots(n, d, seed=n)
    swag = _collected(snaps, max_rank, cls)
    ref = _brute_force(snaps)

    assert swag.n_collected == n
    assert swag.rank == min(n, max_rank)
    torch.testing.assert_close(swag.mean.double(), ref["mean"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(swag.sq_mean.double(), ref["sq_mean"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(swag.variance().double(), ref["var"], rtol=1e-5, atol=1e-6)
    devs = swag.deviations
    assert devs.shape == (min(n, max_rank), d)
    torch.testing.assert_close(devs.double(), ref["deviations"][-max_rank:], rtol=1e-5, atol=1e-6)


def test_variance_of_nearly_constant_snapshots_has_no_cancellation() -> None:
    """Weights near 1000 moving by 1e-3: float64/Welford moments keep the variance.

    The naive float32 running ``sq_mean - mean**2`` of the reference code is off
    by orders of magnitude on the same data, so this test can tell them apart.
    """
    n, d = 30, 50
    g = torch.Generator().manual_seed(0)
    snaps = (1000.0 + 1e-3 * torch.randn(n, d, generator=g, dtype=torch.float64)).float()
    ref = snaps.double().var(0, unbiased=False)
    assert ref.min() > 1e-8

    swag = _collected(snaps, max_rank=20)
    rel_err = ((swag.variance().double() - ref).abs() / ref).max()
    assert rel_err < 1e-3

    mean32 = torch.zeros(d)
    sq32 = torch.zeros(d)
    for i, theta in enumerate(snaps):
        mean32 = (i * mean32 + theta) / (i + 1)
        sq32 = (i * sq32 + theta * theta) / (i + 1)
    naive = (sq32 - mean32**2).clamp(min=1e-30).double()
    assert ((naive - ref).abs() / ref).median() > 0.5


def test_sample_covariance_low_rank_with_fewer_columns_than_max_rank() -> None:
    """k = 4 < K = 20: cov = scale (diag(var) + D^T D / (k-1)), one z2 for the vector.

    The reference code's defects (divisor K-1, scale instead of sqrt(scale),
    an independent z2 per coordinate) give covariances the samples reject.
    """
    scale, n_samples = 0.5, 15_000
    swag = _collected(_snapshots(4, 6, seed=11), max_rank=20)
    assert swag.rank == 4
    samples = _draw(swag, n_samples, seed=1, scale=scale)
    mean = swag.mean.double()

    expected = _expected_cov(swag, scale)
    tol = _cov_tolerance(expected, n_samples)
    cov = _sample_cov(samples, mean)
    assert ((cov - expected).abs() <= tol).all(), (cov - expected) / tol

    mean_tol = SIGMAS * torch.sqrt(torch.diagonal(expected) / n_samples)
    assert ((samples.mean(0) - mean).abs() <= mean_tol).all()

    var = swag.variance().double()
    devs = swag.deviations.double()
    wrong = {
        "divisor K-1": _expected_cov(swag, scale, divisor=swag.max_rank - 1),
        "scale not sqrt": _expected_cov(swag, scale**2),
        "z2 per coordinate": scale * torch.diag(var + (devs**2).sum(0) / 3),
    }
    for name, alt in wrong.items():
        assert ((cov - alt).abs() > _cov_tolerance(alt, n_samples)).any(), name


def test_sample_covariance_diag_only() -> None:
    """SWAG-Diag: cov = scale * diag(var), the low-rank term dropped even when k >= 2."""
    scale, n_samples = 1.0, 10_000
    swag = _collected(_snapshots(9, 6, seed=5), max_rank=4)
    samples = _draw(swag, n_samples, seed=2, scale=scale, diag_only=True)
    mean = swag.mean.double()

    expected = scale * torch.diag(swag.variance().double())
    cov = _sample_cov(samples, mean)
    assert ((cov - expected).abs() <= _cov_tolerance(expected, n_samples)).all()
    mean_tol = SIGMAS * torch.sqrt(torch.diagonal(expected) / n_samples)
    assert ((samples.mean(0) - mean).abs() <= mean_tol).all()

    full = _expected_cov(swag, scale)
    assert ((cov - full).abs() > _cov_tolerance(full, n_samples)).any()


def test_scale_zero_returns_mean_exactly() -> None:
    swag = _collected(_snapshots(7, 10, seed=3), max_rank=5)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(swag.sample(scale=0.0, generator=g), swag.mean)
    assert torch.equal(swag.sample(scale=0.0, diag_only=True, generator=g), swag.mean)
    draw = swag.sampler(scale=0.0)
    draw().add_(1.0)  # a caller editing one draw in place edits no other
    assert torch.equal(draw(), swag.mean)


def test_same_seed_same_sample_and_different_seed_different_sample() -> None:
    swag = _collected(_snapshots(7, 10, seed=3), max_rank=5)
    first = swag.sample(generator=torch.Generator().manual_seed(42))
    again = swag.sample(generator=torch.Generator().manual_seed(42))
    other = swag.sample(generator=torch.Generator().manual_seed(43))
    assert torch.equal(first, again)
    assert not torch.allclose(first, other)


@pytest.mark.parametrize(("n", "diag_only"), [(4, False), (9, False), (9, True)])
def test_a_sampler_draws_by_the_formula_in_turn(n: int, diag_only: bool) -> None:
    """Draw i of ``sampler`` is the formula with the i-th z1 (and z2) of the generator: the
    mean, sqrt(var) and deviations read once serve every draw, the rows oldest first after
    the ring wrapped (n > max_rank)."""
    swag = _collected(_snapshots(n, 12, seed=5), max_rank=5)
    draw = swag.sampler(0.5, diag_only=diag_only, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    k = swag.rank
    for _ in range(3):
        noise = swag.variance().double().sqrt() * torch.randn(12, generator=g).double()
        if not diag_only:
            z2 = torch.randn(k, generator=g).double()
            noise += swag.deviations.double().T @ z2 / math.sqrt(k - 1)
        want = swag.mean.double() + math.sqrt(0.5) * noise
        torch.testing.assert_close(draw().double(), want, rtol=1e-6, atol=1e-6)


def test_noise_scales_with_sqrt_scale() -> None:
    """Same seed, same z: (theta - mean) / sqrt(scale) does not depend on scale."""
    swag = _collected(_snapshots(7, 10, seed=4), max_rank=5)
    mean = swag.mean.double()
    noises = [
        (swag.sample(scale=s, generator=torch.Generator().manual_seed(7)).double() - mean)
        / math.sqrt(s)
        for s in (0.5, 2.0)
    ]
    assert noises[0].abs().max() > 0.1
    torch.testing.assert_close(noises[0], noises[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k", [2, 3])
def test_one_z2_shared_by_the_whole_vector(k: int) -> None:
    """With var ~ 0 (clamped to 1e-30) the noise is D^T z2 / sqrt(k-1): in the span of D.

    Per-coordinate or per-block z2 would leave the k-dimensional row space of D.
    Over many samples the coefficients have variance scale / (k - 1). k = 2 is the
    smallest rank with a low-rank term: dropping it there leaves draws at the mean.
    """
    d, scale, n_samples = 20, 0.5, 3000
    g = torch.Generator().manual_seed(9)
    devs = torch.randn(k, d, generator=g)
    state = {
        "num_params": d,
        "max_rank": 10,
        "n_collected": k,
        "mean": torch.zeros(d, dtype=torch.float64),
        "m2": torch.zeros(d, dtype=torch.float64),
        "deviations": devs,
    }
    swag = SWAG.from_state_dict(state)
    assert swag.variance().max() <= 1e-30
    samples = _draw(swag, n_samples, seed=3, scale=scale)

    coef = torch.linalg.lstsq(devs.double().T, samples.T).solution
    residual = samples.T - devs.double().T @ coef
    assert residual.abs().max() < 1e-5
    coef_var = coef.var(1)
    expected = scale / (k - 1)
    assert ((coef_var - expected).abs() < SIGMAS * expected * math.sqrt(2 / n_samples)).all()


class _OwnAndChildParams(nn.Module):
    """Holds a parameter of its own plus a child: the ordering trap of the reference code."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.5, -0.5]))
        self.body = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale


def test_collect_module_equals_collect_parameters_to_vector() -> None:
    """A module is flattened in parameters_to_vector order: own parameters, then children."""
    torch.manual_seed(0)
    model = _OwnAndChildParams()
    d = sum(p.numel() for p in model.parameters())
    from_module = SWAG(num_params=d, max_rank=3)
    from_vector = SWAG(num_params=d, max_rank=3)
    explicit = []
    for _ in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        from_module.collect(model)
        from_vector.collect(parameters_to_vector(model.parameters()))
        parts = [model.scale, *(p for p in model.body.parameters())]
        explicit.append(torch.cat([p.detach().flatten() for p in parts]))
    assert torch.equal(from_module.mean, from_vector.mean)
    assert torch.equal(from_module.sq_mean, from_vector.sq_mean)
    assert torch.equal(from_module.deviations, from_vector.deviations)
    expected = torch.stack(explicit).double().mean(0)
    torch.testing.assert_close(from_module.mean.double(), expected, rtol=1e-6, atol=1e-6)


def test_swag_mean_equals_torch_averaged_model() -> None:
    """SWA: the SWAG mean is AveragedModel's equal-weight running average."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    averaged = AveragedModel(model)
    d = sum(p.numel() for p in model.parameters())
    swag = SWAG(num_params=d, max_rank=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 5), torch.randint(0, 3, (64,))
    for step in range(30):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step % 5 == 4:
            swag.collect(model)
            averaged.update_parameters(model)
    assert swag.n_collected == 6
    swa = parameters_to_vector(averaged.module.parameters()).detach()
    assert not torch.allclose(swa, parameters_to_vector(model.parameters()).detach())
    torch.testing.assert_close(swag.mean, swa, rtol=1e-5, atol=1e-6)


def _assert_same_posterior(a: SWAG, b: SWAG) -> None:
    """Identical moments, deviations, and identical samples under one seed."""
    assert (a.n_collected, a.rank) == (b.n_collected, b.rank)
    assert torch.equal(a.mean, b.mean)
    assert torch.equal(a.sq_mean, b.sq_mean)
    assert torch.equal(a.variance(), b.variance())
    assert torch.equal(a.deviations, b.deviations)
    for diag_only in (False, True):
        sa = a.sample(diag_only=diag_only, generator=torch.Generator().manual_seed(5))
        sb = b.sample(diag_only=diag_only, generator=torch.Generator().manual_seed(5))
        assert torch.equal(sa, sb)


@pytest.mark.parametrize("n", [3, 5, 7, 11])
def test_state_dict_round_trip(n: int) -> None:
    """Also after wrap-around: the restored ring keeps order and the next write slot."""
    snaps = _snapshots(n + 2, 9, seed=20 + n)
    swag = _collected(snaps[:n], max_rank=5)
    restored = SWAG.from_state_dict(swag.state_dict())
    loaded = SWAG(num_params=9, max_rank=5)
    loaded.load_state_dict(swag.state_dict())
    _assert_same_posterior(swag, restored)
    _assert_same_posterior(swag, loaded)

    for theta in snaps[n:]:
        for s in (swag, restored, loaded):
            s.collect(theta)
    _assert_same_posterior(swag, restored)
    _assert_same_posterior(swag, loaded)
    ref = _brute_force(snaps)["deviations"][-5:]
    torch.testing.assert_close(restored.deviations.double(), ref, rtol=1e-5, atol=1e-6)


def test_state_dict_survives_torch_save_weights_only() -> None:
    swag = _collected(_snapshots(8, 7, seed=30), max_rank=3)
    buf = io.BytesIO()
    torch.save(swag.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    _assert_same_posterior(swag, SWAG.from_state_dict(state))


def test_load_state_dict_rejects_other_shape() -> None:
    swag = _collected(_snapshots(3, 7, seed=31), max_rank=3)
    with pytest.raises(ValueError):
        SWAG(num_params=8, max_rank=3).load_state_dict(swag.state_dict())
    with pytest.raises(ValueError):
        SWAG(num_params=7, max_rank=4).load_state_dict(swag.state_dict())


def test_errors() -> None:
    swag = SWAG(num_params=4, max_rank=3)
    with pytest.raises(RuntimeError):
        swag.sample()
    with pytest.raises(ValueError):
        swag.collect(torch.zeros(5))
    with pytest.raises(ValueError):
        swag.collect(torch.zeros(2, 2))
    with pytest.raises(ValueError):
        swag.collect(nn.Linear(2, 2))
    assert swag.n_collected == 0
    swag.collect(torch.zeros(4))
    with pytest.raises(ValueError):
        swag.sample(scale=-1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_returned_tensors_do_not_alias_collector_state(dtype: torch.dtype) -> None:
    """A sample is a fresh vector: writing into it (vector_to_parameters shares its
    storage with the model, and training then updates it in place) must not move
    the posterior."""
    swag = SWAG(num_params=4, max_rank=3, dtype=dtype)
    swag.collect(torch.ones(4, dtype=dtype))
    swag.collect(torch.full((4,), 3.0, dtype=dtype))
    for theta in (swag.sample(scale=0.0), swag.sample(scale=0.5), swag.mean):
        theta.add_(100.0)
    torch.testing.assert_close(swag.mean, torch.full((4,), 2.0, dtype=dtype))
