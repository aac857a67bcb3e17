"""Properties of the posteriors that hand-made mutation testing found unchecked.

Each test states a definition from ALGORITHMS §2-§5 (or a docstring's promise) and
checks it on small tensors against a brute-force float64 form, so a plausible slip
(a dropped clamp, a float32 cast, an off-by-one rank guard, a lost scale or prior
parameter, a SAM step in the wrong direction) fails here.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bayesavg.posteriors import HWA, SWAG, MeanFieldVI, MomentCollector, svi_step
from bayesavg.posteriors.vi import softplus_inverse

SIGMAS = 6.0


def _cov_tolerance(expected: torch.Tensor, n: int) -> torch.Tensor:
    """SIGMAS standard errors of a sample covariance: Var(C_ij) = (S_ii S_jj + S_ij^2) / n."""
    diag = torch.diagonal(expected)
    return SIGMAS * torch.sqrt((diag[:, None] * diag[None, :] + expected**2) / n)


def _sample_cov(samples: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    centred = samples - mean
    return centred.T @ centred / samples.shape[0]


# --- moments (§2) --------------------------------------------------------------------


def test_variance_of_identical_snapshots_is_clamped_to_1e_30() -> None:
    """§2: var = clamp(s - mean^2, min=1e-30), so sqrt/log of it stay finite and positive."""
    collector = MomentCollector(num_params=5, max_rank=3)
    for _ in range(3):
        collector.collect(torch.linspace(-1.0, 1.0, 5))
    var = collector.variance()
    assert torch.equal(var, torch.full_like(var, 1e-30))


def test_float64_snapshots_keep_float64_moments() -> None:
    """A float64 collector must not round its input through float32: spreads of 1e-9
    around 1 vanish in float32 (eps 6e-8) but are exact enough in float64."""
    g = torch.Generator().manual_seed(0)
    snaps = 1.0 + 1e-9 * torch.randn(6, 4, generator=g, dtype=torch.float64)
    collector = MomentCollector(num_params=4, max_rank=3, dtype=torch.float64)
    for theta in snaps:
        collector.collect(theta)
    torch.testing.assert_close(collector.mean, snaps.mean(0), rtol=0, atol=1e-15)
    expected = snaps.var(0, unbiased=False)
    assert expected.min() > 1e-20
    torch.testing.assert_close(collector.variance(), expected, rtol=1e-6, atol=0)


# --- HWA (§4) --------------------------------------------------------------------------


def _hwa_with_wide_sigmas() -> HWA:
    """Snapshots whose sigma_j ~ 1 are as large as the spread of the mu_j, so each term
    of the HWA covariance is well above the sampling error."""
    g = torch.Generator().manual_seed(0)
    mus = torch.randn(4, 3, generator=g, dtype=torch.float64)
    rhos = 0.5 + 0.2 * torch.randn(4, 3, generator=g, dtype=torch.float64)
    hwa = HWA(3, max_rank=20, dtype=torch.float64)
    for mu, rho in zip(mus, rhos, strict=True):
        hwa.collect(mu, rho)
    return hwa


@pytest.mark.parametrize("scale", [0.0, 0.5])
def test_hwa_adds_the_full_averaged_variance_at_any_scale(scale: float) -> None:
    """§4: w = mu_bar + sqrt(v_bar) z0 + sqrt(scale) (SWAG noise over mu); scale multiplies
    only the SWAG part, so at scale 0 the predictive is N(mu_bar, diag v_bar) (= hwa_mf)."""
    hwa = _hwa_with_wide_sigmas()
    v = hwa.var.mean
    dev = hwa.mu.deviations
    swag_part = torch.diag(hwa.mu.variance()) + dev.T @ dev / (hwa.mu.rank - 1)
    expected = torch.diag(v) + scale * swag_part
    n = 12_000
    g = torch.Generator().manual_seed(1)
    draws = torch.stack([hwa.sample("hwa", scale, g) for _ in range(n)])
    cov = _sample_cov(draws, hwa.mu.mean)
    assert ((cov - expected).abs() <= _cov_tolerance(expected, n)).all(), cov - expected
    wrong = {
        "no v term": scale * swag_part,
        "v times scale": scale * (torch.diag(v) + swag_part),
    }
    for name, alt in wrong.items():
        assert ((cov - alt).abs() > _cov_tolerance(alt, n)).any(), name


# --- mean-field VI (§3) ----------------------------------------------------------------


def _net(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(4, 6), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(6, 3))


def test_sigma_is_softplus_of_rho_and_starts_at_sigma_init() -> None:
    """§3: sigma = softplus(rho), rho initialised to softplus^-1(sigma_0); the samplers
    apply softplus to the stored rho, so another link would change every predictive."""
    vi = MeanFieldVI(_net(), sigma_init=0.4)
    torch.testing.assert_close(vi.sigma, torch.full_like(vi.mu, 0.4), rtol=1e-6, atol=0)
    torch.testing.assert_close(vi.sigma, nn.functional.softplus(vi.rho))


def test_softplus_inverse_inverts_softplus_elementwise() -> None:
    """The tensor inverse used when HWA resets rho to its averaged sigma."""
    sigma = torch.tensor([1e-6, 1e-3, 0.05, 0.5, 3.0], dtype=torch.float64)
    rho = softplus_inverse(sigma)
    torch.testing.assert_close(nn.functional.softplus(rho), sigma, rtol=1e-9, atol=0)


def test_the_kl_uses_the_configured_prior_sigma() -> None:
    """KL(q || N(0, sigma_p^2 I)) in closed form, summed, for sigma_p != 1."""
    prior = 2.5
    vi = MeanFieldVI(_net(), sigma_init=0.05, prior_sigma=prior)
    mu, sigma = vi.mu.detach().double(), vi.sigma.detach().double()
    expected = (torch.log(prior / sigma) + (sigma**2 + mu**2) / (2 * prior**2) - 0.5).sum()
    torch.testing.assert_close(vi.kl().detach().double(), expected, rtol=1e-5, atol=0)


def test_kl_weight_and_mc_samples_enter_the_loss_as_documented() -> None:
    """loss = mean over mc_samples independent eps of CE + kl_weight * KL / n_train."""
    vi = MeanFieldVI(_net(), sigma_init=0.3)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    n_train, kl_weight, mc = 40, 0.3, 3
    torch.manual_seed(11)
    loss, _ = svi_step(n_train, kl_weight=kl_weight, mc_samples=mc)(vi, x, y)
    got = (vi.mu.grad.clone(), vi.rho.grad.clone())
    vi.zero_grad()
    torch.manual_seed(11)
    nll = sum(
        nn.functional.cross_entropy(vi(x, vi.theta(torch.randn(vi.mu.shape))), y) for _ in range(mc)
    )
    ref = nll / mc + kl_weight * vi.kl() / n_train
    ref.backward()
    torch.testing.assert_close(loss, ref.detach())
    torch.testing.assert_close(got[0], vi.mu.grad)
    torch.testing.assert_close(got[1], vi.rho.grad)


def test_f_vi_steps_up_the_gradient_by_exactly_the_radius() -> None:
    """§5: e = r g / ||g||_2 at the sampled theta, so for a small r the F-VI NLL exceeds the
    plain NLL at the same eps by r ||g||_2 to first order (not -r||g||, not r||g||_1)."""
    vi = MeanFieldVI(_net(), sigma_init=0.05)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    r, n_train = 1e-3, 100
    torch.manual_seed(3)
    f_loss, _ = svi_step(n_train, sam_rho=r)(vi, x, y)
    torch.manual_seed(3)
    plain, _ = svi_step(n_train)(vi, x, y)
    torch.manual_seed(3)
    theta = vi.theta(torch.randn(vi.mu.shape)).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(nn.functional.cross_entropy(vi(x, theta), y), [theta])
    rise = float(f_loss - plain)
    assert rise == pytest.approx(r * float(grad.norm()), rel=0.05)


def test_f_vi_replays_the_dropout_mask_in_its_second_pass() -> None:
    """§5: the same dropout mask in both passes, so with a vanishing radius F-VI's
    gradient is plain SVI's for the same eps and the same mask."""
    vi_a, vi_b = MeanFieldVI(_net(0.5), 0.05), MeanFieldVI(_net(0.5), 0.05)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    torch.manual_seed(9)
    svi_step(100, sam_rho=1e-9)(vi_a, x, y)
    torch.manual_seed(9)
    svi_step(100)(vi_b, x, y)
    torch.testing.assert_close(vi_a.mu.grad, vi_b.mu.grad, rtol=0, atol=1e-5)
    torch.testing.assert_close(vi_a.rho.grad, vi_b.rho.grad, rtol=0, atol=1e-5)


# --- last-layer Laplace ------------------------------------------------------------------


def _psd(n: int, g: torch.Generator) -> torch.Tensor:
    """A random positive-definite float64 (n, n) matrix."""
    m = torch.randn(n, n, generator=g, dtype=torch.float64)
    return m @ m.T + 0.1 * torch.eye(n, dtype=torch.float64)


LAPLACE_C, LAPLACE_D = 3, 4


def _synthetic_laplace(h: float, delta: float) -> tuple[dict, torch.Tensor]:
    """A Laplace state from random PSD Kronecker factors (weight: B (C, C), A (D, D);
    bias: B_b), and the dense posterior precision the module docstring defines for it:
    block_diag(h * kron(B, A) + delta I, h * B_b + delta I)."""
    from bayesavg.posteriors.last_layer_laplace import LAPLACE_FORMAT

    c, d = LAPLACE_C, LAPLACE_D
    g = torch.Generator().manual_seed(0)
    b, a, bb = _psd(c, g), _psd(d, g), _psd(c, g)
    (l1, q1), (l2, q2), (lb, qb) = (torch.linalg.eigh(m) for m in (b, a, bb))
    state = {
        "format": LAPLACE_FORMAT,
        "layer": "head",
        "in_features": d,
        "out_features": c,
        "bias": True,
        "mean": torch.randn(c * d + c, generator=g),
        "blocks": [
            {"eigenvectors": [q1, q2], "eigenvalues": [l1, l2]},
            {"eigenvectors": [qb], "eigenvalues": [lb]},
        ],
        "deltas": torch.tensor([delta, delta], dtype=torch.float64),
        "h_factor": h,
        "prior_precision": torch.tensor([delta], dtype=torch.float64),
        "n_data": 10,
    }
    precision = torch.block_diag(
        h * torch.kron(b, a) + delta * torch.eye(c * d, dtype=torch.float64),
        h * bb + delta * torch.eye(c, dtype=torch.float64),
    )
    return state, precision


def test_laplace_precision_is_h_factor_times_the_ggn_plus_the_prior() -> None:
    """Module docstring: the block precision is H * h_factor + delta. With h_factor != 1
    (sigma_noise or temperature not 1) each factor of the Kronecker block takes
    h_factor ** (1/2), not h_factor: checked against the dense diag(J P^-1 J^T),
    J = [I_C kron phi^T, I_C]."""
    from bayesavg.posteriors.last_layer_laplace import LastLayerLaplace

    state, precision = _synthetic_laplace(h=4.0, delta=0.7)
    post = LastLayerLaplace.from_state_dict(state)
    sigma = torch.linalg.inv(precision)
    phi = torch.randn(5, LAPLACE_D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    eye = torch.eye(LAPLACE_C, dtype=torch.float64)
    jac = torch.stack([torch.cat([torch.kron(eye, p[None, :]), eye], dim=1) for p in phi])
    dense = torch.einsum("ncp,pq,nkq->nck", jac, sigma, jac).diagonal(dim1=1, dim2=2)
    torch.testing.assert_close(post.logit_variance(phi), dense, rtol=1e-9, atol=0)


def test_laplace_state_with_a_zero_prior_precision_is_refused() -> None:
    """check_state: deltas must be > 0 (a zero prior precision is an improper prior)."""
    from bayesavg.posteriors.last_layer_laplace import check_state

    state, _ = _synthetic_laplace(h=1.0, delta=0.0)
    with pytest.raises(ValueError, match="deltas"):
        check_state(state, LAPLACE_C * LAPLACE_D + LAPLACE_C)


def test_layer_inputs_cover_every_point_whatever_the_batch_size() -> None:
    """The probit predictive reads the last layer's inputs batch by batch: a batch size
    that does not divide N (or is 1) must give the same (N, D) features as one pass."""
    from bayesavg.posteriors.laplace_predictive import layer_inputs, probit_log_probs
    from bayesavg.posteriors.last_layer_laplace import LastLayerLaplace

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, LAPLACE_D), nn.Tanh(), nn.Linear(LAPLACE_D, LAPLACE_C))
    x = torch.randn(10, 5)
    with torch.no_grad():
        expected = model[:-1](x)
    post = LastLayerLaplace.from_state_dict(_synthetic_laplace(h=1.0, delta=0.7)[0])
    whole = probit_log_probs(post, model, "2", x, batch_size=64)
    for batch_size in (1, 3, 10):
        torch.testing.assert_close(layer_inputs(model, "2", x, batch_size), expected)
        torch.testing.assert_close(probit_log_probs(post, model, "2", x, batch_size), whole)


# --- temperature scaling -----------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.1, 10.0])
def test_temperatures_well_inside_the_documented_bracket_are_fitted(temperature: float) -> None:
    """fit_temperature searches [0.05, 20]: a planted T of 0.1 or 10 is recovered, not
    refused as degenerate (a narrower bracket would refuse real predictives)."""
    from bayesavg.predictors.calibration import fit_temperature

    gen = torch.Generator().manual_seed(0)
    z = 3.0 * torch.randn(20000, 10, generator=gen, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / temperature, dim=-1), 1, generator=gen)[:, 0]
    fitted = fit_temperature(torch.log_softmax(z, dim=-1), y)
    assert fitted == pytest.approx(temperature, rel=0.05)


# --- predictors.sampling: each method draws from its own posterior -----------------------


def _posterior(theta: torch.Tensor, **blocks: object) -> object:
    """A PosteriorFile holding only what the weight samplers read (no network is built)."""
    from bayesavg.posteriors.file import PosteriorFile

    return PosteriorFile(
        trajectory="t",
        model_name="mlp",
        model_kwargs={},
        input_shape=(1, 1, 1),
        mean=[0.0],
        std=[1.0],
        num_classes=2,
        data={},
        theta=theta,
        buffers={},
        **blocks,
    )


def _drawn(posterior: object, method: str, scale: float, seed: int, n: int) -> torch.Tensor:
    from bayesavg.config.methods import REGISTRY
    from bayesavg.predictors.sampling import draws

    g = torch.Generator().manual_seed(seed)
    made = draws(posterior, REGISTRY[method], scale, g, torch.device("cpu"), n)
    return torch.stack([made.draw(s)[0] for s in range(n)])


def test_vi_predictor_draws_n_mu_softplus_rho_squared_reproducibly() -> None:
    """§3: the vi predictor samples N(theta, diag softplus(rho)^2) from its generator."""
    d, n = 4, 20_000
    theta = torch.linspace(-1.0, 1.0, d)
    rho = torch.tensor([-1.0, 0.0, 0.5, 1.0])
    post = _posterior(theta, rho=rho)
    samples = _drawn(post, "vi", 1.0, seed=0, n=n).double()
    expected = torch.diag(nn.functional.softplus(rho).double() ** 2)
    cov = _sample_cov(samples, theta.double())
    assert ((cov - expected).abs() <= _cov_tolerance(expected, n)).all(), cov - expected
    assert torch.equal(_drawn(post, "vi", 1.0, 3, 4), _drawn(post, "vi", 1.0, 3, 4))


@pytest.mark.parametrize("method", ["hwa", "hwa_mf", "hwa_rho"])
def test_hwa_predictors_draw_their_own_variant_at_the_asked_scale(method: str) -> None:
    """Each HWA predictor is HWA.sample of its own variant with the requested scale: the
    same generator stream gives the same networks."""
    hwa = _hwa_with_wide_sigmas()
    post = _posterior(hwa.mu.mean.float(), hwa=hwa.state_dict())
    restored = HWA.from_state_dict(hwa.state_dict())
    g = torch.Generator().manual_seed(2)
    expected = torch.stack([restored.sample(method, 2.0, g) for _ in range(3)])
    torch.testing.assert_close(_drawn(post, method, 2.0, seed=2, n=3), expected, rtol=0, atol=0)


@pytest.mark.parametrize("method", ["swag", "swag_diag"])
def test_swag_predictors_sample_at_the_asked_scale(method: str) -> None:
    """The swag predictors pass the requested scale (here 2, not the default 0.5) and
    diag_only for swag_diag to SWAG.sample."""
    g = torch.Generator().manual_seed(0)
    swag = SWAG(num_params=5, max_rank=4)
    for _ in range(6):
        swag.collect(torch.randn(5, generator=g))
    post = _posterior(swag.mean, collector=swag.state_dict())
    g = torch.Generator().manual_seed(4)
    diag_only = method == "swag_diag"
    expected = torch.stack([swag.sample(2.0, diag_only=diag_only, generator=g) for _ in range(3)])
    torch.testing.assert_close(_drawn(post, method, 2.0, seed=4, n=3), expected, rtol=0, atol=0)


def test_swag_refuses_one_snapshot_and_swag_diag_samples_it() -> None:
    """With one snapshot there is no deviation to span a low-rank term: swag says so in
    one line, swag_diag (which needs none) samples."""
    from bayesavg.runtime.errors import UserError

    swag = SWAG(num_params=3, max_rank=4)
    swag.collect(torch.ones(3))
    post = _posterior(swag.mean, collector=swag.state_dict())
    with pytest.raises(UserError, match="swag needs at least 2 snapshots, t has 1"):
        _drawn(post, "swag", 0.5, seed=0, n=1)
    assert _drawn(post, "swag_diag", 0.5, seed=0, n=2).shape == (2, 3)


def test_multiswag_draws_each_member_s_swag_in_turn_at_the_asked_scale() -> None:
    """Network s comes from member s mod M's SWAG at the requested scale (here 2), all
    from the one generator stream."""
    g = torch.Generator().manual_seed(0)
    swags = []
    for _ in range(3):
        swag = SWAG(num_params=4, max_rank=3)
        for _ in range(4):
            swag.collect(torch.randn(4, generator=g))
        swags.append(swag)
    post = _posterior(
        swags[0].mean,
        samples={
            "theta": torch.stack([s.mean for s in swags]),
            "buffers": None,
            "collectors": [s.state_dict() for s in swags],
        },
    )
    g = torch.Generator().manual_seed(7)
    expected = torch.stack([swags[s % 3].sample(2.0, generator=g) for s in range(6)])
    torch.testing.assert_close(
        _drawn(post, "multiswag", 2.0, seed=7, n=6), expected, rtol=0, atol=0
    )


def test_sigma_ratio_is_sigma_over_sigma_init_by_quantile() -> None:
    """What training did to the variances: quantiles of softplus(rho) / sigma_init."""
    import numpy as np

    from bayesavg.config.methods import REGISTRY
    from bayesavg.predictors.sampling import sigma_ratio

    rho = torch.linspace(-6.0, 1.0, 101)
    post = _posterior(torch.zeros(101), rho=rho)
    post.extra["sigma_init"] = 0.05
    ratio = (nn.functional.softplus(rho.double()) / 0.05).numpy()
    got = sigma_ratio(post, REGISTRY["vi"])
    assert got is not None
    assert got["min"] == pytest.approx(ratio.min()) and got["max"] == pytest.approx(ratio.max())
    assert got["mean"] == pytest.approx(ratio.mean())
    assert got["median"] == pytest.approx(np.quantile(ratio, 0.5))
    assert got["p10"] == pytest.approx(np.quantile(ratio, 0.1))


def test_ensemble_members_keep_their_own_batchnorm_buffers() -> None:
    """Member s is its own weights with its own BatchNorm statistics, not the first's."""
    from bayesavg.config.methods import REGISTRY
    from bayesavg.predictors.sampling import draws

    thetas = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    buffers = [{"bn.running_mean": torch.full((2,), float(i))} for i in range(3)]
    post = _posterior(thetas[0], samples={"theta": thetas, "buffers": buffers})
    made = draws(post, REGISTRY["ensemble"], 1.0, torch.Generator(), torch.device("cpu"), 3)
    for s in range(3):
        theta, member_buffers = made.draw(s)
        assert torch.equal(theta, thetas[s])
        assert member_buffers is not None
        assert torch.equal(member_buffers["bn.running_mean"], buffers[s]["bn.running_mean"])
