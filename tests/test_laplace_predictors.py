"""The laplace trajectory and its predictors: the start's network with its last layer's
KFAC Laplace posterior in the file, predicted by probit and by draws of the layer."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from test_methods import CPU, SGD, _params, _split

from bayesavg.evaluation.evaluate import evaluate
from bayesavg.posteriors.file import PosteriorFile, load_posterior, load_theta, save_posterior
from bayesavg.posteriors.last_layer_laplace import LastLayerLaplace
from bayesavg.runtime.errors import UserError
from bayesavg.trajectories import finetune, laplace_fit, pretrain
from bayesavg.trajectories.common import RunResult
from bayesavg.trajectories.laplace_fit import fit_laplace

LAPLACE = {"kind": "laplace", "start": "sgd", "batch_size": 512}
PREDICTORS = {
    "probit": {"trajectory": "la", "method": "laplace"},
    "mc": {"trajectory": "la", "method": "laplace_mc"},
}


@pytest.fixture(scope="module")
def fitted_run(mnist5k_prepared: Any) -> tuple[PosteriorFile, RunResult]:
    """The sgd trajectory and the laplace trajectory's run at its final weights."""
    prepared = mnist5k_prepared.prepared
    params = _params({"sgd": dict(SGD), "la": dict(LAPLACE)}, PREDICTORS)
    start = finetune(params, "sgd", prepared, pretrain(params, prepared, CPU).posterior, CPU)
    assert start is not None
    return start.posterior, fit_laplace(params, "la", prepared, start.posterior, CPU)


@pytest.fixture(scope="module")
def fitted(fitted_run: tuple[PosteriorFile, RunResult]) -> tuple[PosteriorFile, PosteriorFile]:
    """The sgd trajectory and the Laplace approximation at its final weights."""
    return fitted_run[0], fitted_run[1].posterior


def test_the_history_row_is_the_probit_predictives_validation_metrics(
    fitted_run: tuple[PosteriorFile, RunResult], mnist5k_prepared: Any
) -> None:
    """The row a laplace run plots (dvc plots, the report) is what evaluate reports."""
    run = fitted_run[1]
    (row,) = run.history
    got = evaluate(run.posterior, "laplace", _split(run.posterior, mnist5k_prepared.prepared))
    assert row["epoch"] == 0.0 and row["prior_precision"] > 0
    assert row["val_loss"] == pytest.approx(got["val"].metrics["nll"], rel=1e-6)
    assert row["val_accuracy"] == pytest.approx(got["val"].metrics["accuracy"], rel=1e-12)


def test_the_file_keeps_the_weights_and_round_trips(
    fitted: tuple[PosteriorFile, PosteriorFile], tmp_path: Path
) -> None:
    start, post = fitted
    assert torch.equal(post.theta, start.theta)
    assert post.provides() == {"weights", "laplace"}
    assert post.laplace is not None and float(post.laplace["prior_precision"][0]) > 0
    save_posterior(tmp_path / "p.pt", post)
    assert load_posterior(tmp_path / "p.pt").laplace["layer"] == post.laplace["layer"]
    broken = dataclasses.replace(post, laplace={**post.laplace, "layer": "nowhere"})
    save_posterior(tmp_path / "bad.pt", broken)
    with pytest.raises(UserError, match=r"laplace\.layer is 'nowhere'"):
        load_posterior(tmp_path / "bad.pt")


def test_probit_predictor_is_the_closed_form_glm_predictive(
    fitted: tuple[PosteriorFile, PosteriorFile], mnist5k_prepared: Any
) -> None:
    _, post = fitted
    split = _split(post, mnist5k_prepared.prepared)
    got = evaluate(post, "laplace", split, n_samples=30)["val"]
    assert got.metrics["n_samples"] == 1
    la = LastLayerLaplace.from_state_dict(post.laplace)
    model = post.build_model()
    captured: list[torch.Tensor] = []
    layer = model.get_submodule(post.laplace["layer"])
    layer.register_forward_hook(lambda m, i, o: captured.append(i[0]))
    with torch.no_grad():
        logits = model(split["val"][0]).double()
    torch.testing.assert_close(got.log_probs, la.log_probs(captured[0], "probit"))
    # the probit only tempers each logit: the top class barely moves, confidence drops
    map_logp = torch.log_softmax(logits, 1)
    assert (got.log_probs.argmax(1) == map_logp.argmax(1)).float().mean() > 0.99
    assert got.log_probs.max(1).values.mean() < map_logp.max(1).values.mean()


def test_mc_predictor_averages_networks_with_drawn_last_layers(
    fitted: tuple[PosteriorFile, PosteriorFile], mnist5k_prepared: Any
) -> None:
    _, post = fitted
    split = _split(post, mnist5k_prepared.prepared)
    got = evaluate(post, "laplace_mc", split, n_samples=5, seed=4)["val"]
    la = LastLayerLaplace.from_state_dict(post.laplace)
    gen = torch.Generator().manual_seed(4)
    k = la.num_params
    model = post.build_model()
    probs = []
    for _ in range(5):
        theta = post.theta.clone()
        theta[-k:] = la.sample(None, gen)  # the MLP's last layer closes the vector
        load_theta(model, theta, post.buffers)
        with torch.no_grad():
            probs.append(torch.softmax(model(split["val"][0]).double(), 1))
    torch.testing.assert_close(got.log_probs, torch.stack(probs).mean(0).log(), rtol=0, atol=1e-9)


def test_laplace_params_are_checked() -> None:
    with pytest.raises(UserError, match="a Laplace approximation needs one trained network"):
        _params({"la": {**LAPLACE, "start": "init"}}, {})
    ensemble = {**SGD, "kind": "ensemble", "members": 1}
    with pytest.raises(UserError, match="a Laplace approximation needs one trained network"):
        _params({"e": ensemble, "la": {**LAPLACE, "start": "e"}}, {})
    with pytest.raises(UserError, match=r"laplace needs a last-layer Laplace posterior"):
        _params({"sgd": dict(SGD)}, {"p": {"trajectory": "sgd", "method": "laplace"}})
    with pytest.raises(UserError, match="prior_precision"):
        _params({"sgd": dict(SGD), "la": {**LAPLACE, "prior_precision": -1.0}}, {})


def test_the_fit_makes_each_training_batch_as_laplace_torch_reads_it(
    fitted: tuple[PosteriorFile, PosteriorFile],
    mnist5k_prepared: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Normalised float32 is 4x a split's uint8 bytes, and a streamed split is larger
    than the device: no batch is made before the fit reads it, and the fit is the same."""
    start, post = fitted
    prepared = mnist5k_prepared.prepared
    events: list[str] = []
    real_fit, real_input = laplace_fit.fit_last_layer, PosteriorFile.model_input

    def fit(model: torch.nn.Module, loader: Any, **kwargs: Any) -> dict[str, Any]:
        events.append("fit")
        return real_fit(model, loader, **kwargs)

    def model_input(self: PosteriorFile, x: torch.Tensor, device: Any) -> torch.Tensor:
        events.append("batch")
        return real_input(self, x, device)

    monkeypatch.setattr(laplace_fit, "fit_last_layer", fit)
    monkeypatch.setattr(PosteriorFile, "model_input", model_input)
    params = _params({"sgd": dict(SGD), "la": dict(LAPLACE)}, PREDICTORS)
    again = fit_laplace(params, "la", prepared, start, CPU).posterior
    batches = -(-len(prepared.train.y) // LAPLACE["batch_size"])
    assert events[0] == "fit" and events.count("batch") >= batches, events  # none before
    assert post.laplace is not None and again.laplace is not None
    assert torch.equal(again.laplace["prior_precision"], post.laplace["prior_precision"])
