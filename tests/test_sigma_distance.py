"""The DSWAG sweep's sigma-distance (ALGORITHMS §9): test accuracy and NLL of the single
network theta_bar + m * sigma * z, against a brute force from the snapshots themselves."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest
import torch

from bayesavg.analyses.sweep import sigma_distance
from bayesavg.posteriors import SWAG
from bayesavg.posteriors.file import load_posterior, load_theta

if TYPE_CHECKING:
    from conftest import PreparedDir, TinyPosteriors

MULTIPLES = (0.0, 1.0, 2.5)
DRAWS, SEED = 2, 7


def test_rows_are_the_networks_at_the_mean_plus_m_sigma_z(
    tiny_posteriors: TinyPosteriors, mnist5k_prepared: PreparedDir
) -> None:
    base = load_posterior(tiny_posteriors.plain)
    gen = torch.Generator().manual_seed(3)
    snapshots = [base.theta + 0.05 * torch.randn(base.theta.shape, generator=gen) for _ in range(4)]
    swag = SWAG(base.theta.numel(), max_rank=2)  # fewer deviations than snapshots: sigma
    for s in snapshots:  # is the diagonal of all of them, not of the low-rank part
        swag.collect(s)
    posterior = dataclasses.replace(base, trajectory="swag", collector=swag.state_dict())
    test = mnist5k_prepared.prepared.test
    rows = sigma_distance(posterior, posterior.inputs(test.x), test.y, MULTIPLES, DRAWS, SEED)

    stacked = torch.stack(snapshots).double()
    mean, sigma = stacked.mean(0), stacked.var(0, correction=0).sqrt()  # sq_mean - mean**2
    gen = torch.Generator().manual_seed(SEED)
    zs = [torch.randn(mean.shape, generator=gen) for _ in range(DRAWS)]  # the same z for every m
    x = posterior.model_input(test.x)
    assert [(r["multiple"], r["draw"]) for r in rows] == [
        (m, d) for m in MULTIPLES for d in range(DRAWS)
    ]
    nlls = []
    for r in rows:
        model = posterior.build_model()
        load_theta(model, (mean + r["multiple"] * sigma * zs[r["draw"]].double()).float(), {})
        with torch.no_grad():
            logp = torch.log_softmax(model.eval()(x).double(), 1)
        assert r["accuracy"] == pytest.approx((logp.argmax(1) == test.y).double().mean().item())
        nll = torch.nn.functional.nll_loss(logp, test.y).item()
        assert r["nll"] == pytest.approx(nll, rel=1e-5)
        assert r["sigma_norm"] == pytest.approx(sigma.norm().item(), rel=1e-5)
        nlls.append(nll)
    assert nlls[0] == pytest.approx(nlls[1], rel=1e-5)  # m = 0: theta_bar whatever the draw
    assert len({round(v, 4) for v in nlls[DRAWS:]}) == len(nlls) - DRAWS  # m > 0 differ
