"""Every method of the registry works end to end on a tiny BatchNorm model.

For each entry: params with a predictor of the method validate; a trajectory
that provides what it needs is fine-tuned; the predictor evaluates to finite
metrics with the expected number of networks; sharpness is measured at its
centre; a variational method reports sigma / sigma_0; the CLI evaluates it.
Adding a method to ``bayesavg.config.methods`` adds a case here automatically.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pipeline_repo import small_params

from bayesavg.cli import main as cli_main
from bayesavg.config import Params, parse_params
from bayesavg.config.methods import PROVIDES, REGISTRY, Method
from bayesavg.evaluation.centre import centre_sharpness
from bayesavg.evaluation.evaluate import evaluate
from bayesavg.posteriors.file import PosteriorFile, save_posterior
from bayesavg.predictors.sampling import CENTRES, SAMPLERS, SIGMAS, sigma_ratio
from bayesavg.trajectories import finetune, pretrain_members

CPU = torch.device("cpu")
MEMBERS = 2


def _raw() -> dict[str, Any]:
    return small_params(epochs=2, pretrain_epochs=1, members=MEMBERS)


def _trajectory_for(params: Params, method: Method) -> str:
    """The first default trajectory that provides what ``method`` needs."""
    for name, traj in params.finetune.items():
        dropout_ok = not method.stochastic_dropout or params.dropout_of(name) > 0
        if method.needs in traj.provides() and dropout_ok:
            return name
    raise AssertionError(f"no default trajectory provides {method.needs} for {method.name}")


@pytest.fixture(scope="module")
def posteriors(mnist5k_prepared: Any) -> dict[str, PosteriorFile]:
    """Each needed trajectory fine-tuned once (its start first)."""
    params = parse_params(_raw())
    prepared = mnist5k_prepared.prepared
    done: dict[str, PosteriorFile] = {"pretrain": pretrain_members(params, prepared, CPU).posterior}

    def get(name: str) -> PosteriorFile:
        if name not in done:
            start = get(params.finetune[name].start)
            done[name] = finetune(params, name, prepared, start, CPU).posterior
        return done[name]

    for method in REGISTRY.values():
        get(_trajectory_for(params, method))
    return done


def test_the_registry_is_complete() -> None:
    """Every entry has its sampling function, centre and sigma source."""
    for method in REGISTRY.values():
        assert method.name in SAMPLERS, method.name
        assert method.centre in CENTRES, method.name
        assert method.sigma is None or method.sigma in SIGMAS, method.name
        assert method.needs in PROVIDES and method.label, method.name
        assert method.baseline is None or method.baseline in REGISTRY, method.name


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_method_end_to_end(
    name: str,
    posteriors: dict[str, PosteriorFile],
    mnist5k_prepared: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    method = REGISTRY[name]
    raw = _raw()
    trajectory = _trajectory_for(parse_params(raw), method)
    raw["evaluate"]["predictors"] = {trajectory: {"p": {"method": name}}}
    params = parse_params(raw)  # a predictor of this method validates
    posterior = posteriors[trajectory]
    prepared = mnist5k_prepared.prepared
    bn_x = posterior.model_input(prepared.train.x[:500], CPU)
    splits = {"val": (posterior.model_input(prepared.val.x, CPU), prepared.val.y)}
    scale = params.evaluate.by_name["p"].effective_scale()
    result = evaluate(posterior, name, splits, n_samples=3, scale=scale, bn_x=bn_x, seed=0)["val"]
    expected = {"one": 1, "members": MEMBERS, "draws": 3, "member_draws": MEMBERS * 3}
    assert result.metrics["n_samples"] == expected[method.samples]
    assert all(math.isfinite(result.metrics[k]) for k in ("accuracy", "nll", "ece", "brier"))
    assert result.metrics["accuracy"] > 0.5
    sharp = centre_sharpness(
        posterior,
        name,
        posterior.model_input(prepared.train.x[:200], CPU),
        prepared.train.y[:200],
        bn_x=bn_x,
        rho=0.05,
        probes=1,
        seed=0,
        device=CPU,
    )
    assert all(math.isfinite(v) for v in sharp.values())
    spread = sigma_ratio(posterior, method)
    assert (spread is not None) == (method.sigma is not None)
    if spread is not None:
        assert 0 < spread["min"] <= spread["median"] <= spread["max"]
    file, out = tmp_path / "posterior.pt", tmp_path / "metrics.json"
    save_posterior(file, posterior)
    cli_main(
        [
            *["evaluate", "--posterior", str(file), "--predictor", name, "--data", "mnist5k"],
            *["--samples", "2", "--bn-update-fraction", "0.2", "--out", str(out)],
        ]
    )
    assert json.loads(out.read_text())["predictor"] == name
    capsys.readouterr()
