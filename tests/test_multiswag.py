"""MultiSWAG and MultiSWA (Wilson & Izmailov 2020) against their definitions: M SWAG
trajectories, one per pretrained member, and the equal mixture of S draws from each."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from test_methods import CPU, SGD, _params, _split

from bayesavg.evaluation.evaluate import evaluate
from bayesavg.posteriors import SWAG
from bayesavg.posteriors.file import PosteriorFile, load_theta
from bayesavg.runtime.errors import UserError
from bayesavg.trajectories import finetune, pretrain_members

SWAG_RUN = {**SGD, "collect": {"start_epoch": 0, "every": 4, "max_rank": 5}}


@pytest.fixture(scope="module")
def trained(mnist5k_prepared: Any) -> tuple[PosteriorFile, PosteriorFile]:
    """A two-member MultiSWAG trajectory ``m`` and the single SWAG trajectory of that name."""
    prepared = mnist5k_prepared.prepared
    members = 2
    predictors = {
        "multiswag": {"trajectory": "m", "method": "multiswag"},
        "multiswa": {"trajectory": "m", "method": "multiswa"},
    }
    params = _params(
        {"m": {**SWAG_RUN, "kind": "ensemble", "members": members}}, predictors, members=members
    )
    single = _params({"m": dict(SWAG_RUN)}, {"swag": {"trajectory": "m", "method": "swag"}})
    start = pretrain_members(params, prepared, CPU).posterior
    multi = finetune(params, "m", prepared, start, CPU).posterior
    one = finetune(single, "m", prepared, start, CPU).posterior
    return multi, one


def test_multiswag_of_one_member_is_swag(
    trained: tuple[PosteriorFile, PosteriorFile], mnist5k_prepared: Any
) -> None:
    """Member 0 is the SWAG trajectory of the same name, bitwise, and MultiSWAG over it
    alone draws exactly SWAG's networks."""
    multi, one = trained
    assert multi.collector is None and multi.provides() >= {"members", "member_snapshots"}
    assert multi.samples is not None and one.collector is not None
    samples = multi.samples
    multi = dataclasses.replace(
        multi,
        samples={
            "theta": samples["theta"][:1],
            "buffers": samples["buffers"][:1],
            "collectors": samples["collectors"][:1],
        },
    )
    for key in ("mean", "m2", "deviations"):
        assert torch.equal(multi.samples["collectors"][0][key], one.collector[key])
    split = _split(one, mnist5k_prepared.prepared)
    swag = evaluate(one, "swag", split, n_samples=8, scale=0.5, seed=3)["val"]
    mswag = evaluate(multi, "multiswag", split, n_samples=8, scale=0.5, seed=3)["val"]
    assert torch.equal(swag.log_probs, mswag.log_probs)
    assert mswag.metrics["n_samples"] == 8


def test_multiswag_is_the_equal_mixture_of_s_draws_per_member(
    trained: tuple[PosteriorFile, PosteriorFile], mnist5k_prepared: Any
) -> None:
    prepared = mnist5k_prepared.prepared
    multi, _ = trained
    assert multi.samples is not None
    swags = [SWAG.from_state_dict(c) for c in multi.samples["collectors"]]
    assert not torch.equal(swags[0].mean, swags[1].mean)
    split = _split(multi, prepared)
    x = split["val"][0]
    model = multi.build_model()

    def probs(theta: torch.Tensor) -> torch.Tensor:
        load_theta(model, theta, {})
        with torch.no_grad():
            return torch.softmax(model(x).double(), dim=1)

    gen = torch.Generator().manual_seed(5)
    draws = [swags[s % 2].sample(0.5, generator=gen) for s in range(2 * 6)]
    got = evaluate(multi, "multiswag", split, n_samples=6, scale=0.5, seed=5)["val"]
    assert got.metrics["n_samples"] == 12
    brute = torch.stack([probs(theta) for theta in draws]).mean(0).log()
    torch.testing.assert_close(got.log_probs, brute, rtol=0, atol=1e-9)

    got = evaluate(multi, "multiswa", split, n_samples=6)["val"]
    assert got.metrics["n_samples"] == 2
    brute = torch.stack([probs(swag.mean) for swag in swags]).mean(0).log()
    torch.testing.assert_close(got.log_probs, brute, rtol=0, atol=1e-9)


def test_multiswag_needs_members_with_snapshots() -> None:
    predictor = {"p": {"trajectory": "e", "method": "multiswag"}}
    with pytest.raises(UserError, match=r"SWAG snapshots of every ensemble member"):
        _params({"e": {**SGD, "kind": "ensemble", "members": 1}}, predictor)
    with pytest.raises(UserError, match=r"SWAG snapshots of every ensemble member"):
        _params({"e": dict(SWAG_RUN)}, predictor)
