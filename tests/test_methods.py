"""MC dropout, deep ensembles and SGLD, checked against their definitions by brute force."""

from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pipeline_repo import prune_landscape
from torch import nn

from bayesavg.config import DEFAULT_DROPOUT, parse_params
from bayesavg.evaluation.centre import centre_sharpness
from bayesavg.evaluation.evaluate import evaluate, method_of
from bayesavg.evaluation.sharpness import sam_sharpness
from bayesavg.models import MODELS, build_model, has_dropout
from bayesavg.posteriors.file import PosteriorFile, load_theta
from bayesavg.posteriors.hwa import HWA
from bayesavg.predictors.sampling import centres
from bayesavg.runtime.errors import UserError
from bayesavg.seeding import derive_seed
from bayesavg.trajectories import finetune, pretrain, pretrain_members
from bayesavg.trajectories.gradient import KeptSamples
from bayesavg.trajectories.sgld import SGLD

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
SGD = {"start": "pretrain", "epochs": 1, "batch_size": 128, "momentum": 0.9}


def _params(finetune: dict[str, Any], predictors: dict[str, Any], members: int = 1) -> Any:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["model"] = {"name": "mlp", "hidden": [16]}
    raw["pretrain"].update(epochs=1, batch_size=128, members=members)
    raw["finetune"] = finetune
    grouped: dict[str, dict[str, Any]] = {}  # params.yaml lists predictors by trajectory
    for name, pred in predictors.items():
        grouped.setdefault(pred["trajectory"], {})[name] = {
            k: v for k, v in pred.items() if k != "trajectory"
        }
    raw["evaluate"]["predictors"] = grouped
    raw["evaluate"]["plane"]["trajectories"] = []
    raw["evaluate"]["dswag_sweep"]["workers"] = []
    prune_landscape(raw)
    return parse_params(raw)


def _split(post: PosteriorFile, prepared: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {"val": (post.model_input(prepared.val.x, CPU), prepared.val.y)}


def _probs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.softmax(model(x).double(), dim=1)


# --- models ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "lenet5", "preresnet20"])
def test_dropout_rate_keeps_parameters_and_rate_zero_is_identity(name: str) -> None:
    shape = (3, 32, 32)
    torch.manual_seed(0)
    plain = build_model(name, shape, 10)
    torch.manual_seed(0)
    dropped = build_model(name, shape, 10, {"dropout": 0.5})
    assert [p.shape for p in plain.parameters()] == [p.shape for p in dropped.parameters()]
    assert has_dropout(dropped) and not has_dropout(plain)
    x = torch.randn(4, *shape)
    plain.eval()
    with torch.no_grad():
        deterministic = plain(x)
    for m in plain.modules():
        if isinstance(m, nn.Dropout):
            m.train()
    state = torch.get_rng_state()
    with torch.no_grad():
        sampling = plain(x)
    assert torch.equal(state, torch.get_rng_state()), "rate 0 must draw no random numbers"
    assert torch.equal(sampling, deterministic)


def test_config_knows_each_models_default_dropout() -> None:
    for name, build in MODELS.items():
        default = inspect.signature(build).parameters["dropout"].default
        assert DEFAULT_DROPOUT.get(name, 0.0) == default, name


# --- MC dropout --------------------------------------------------------------


def _dropout_posterior(tiny: Any, rate: float) -> PosteriorFile:
    from bayesavg.posteriors.file import load_posterior

    post = load_posterior(tiny.plain)
    return dataclasses.replace(post, model_kwargs={**post.model_kwargs, "dropout": rate})


def test_mc_dropout_averages_seeded_stochastic_passes(
    tiny_posteriors: Any, mnist5k_prepared: Any
) -> None:
    post = _dropout_posterior(tiny_posteriors, 0.3)
    split = _split(post, mnist5k_prepared.prepared)
    outside = torch.get_rng_state()
    got = evaluate(post, "mc_dropout", split, n_samples=4, seed=7, batch_size=10_000)["val"]
    assert torch.equal(outside, torch.get_rng_state()), "the caller's RNG stream is untouched"
    model = post.build_model()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.train()
    x = split["val"][0]
    passes = []
    for s in range(1, 5):  # each pass's masks from its own stream (any rank can compute it)
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(7, "sample", s))
            passes.append(_probs(model, x))
    brute = torch.stack(passes).mean(0).log()
    torch.testing.assert_close(got.log_probs, brute, rtol=0, atol=1e-9)
    again = evaluate(post, "mc_dropout", split, n_samples=4, seed=7, batch_size=10_000)["val"]
    assert torch.equal(again.log_probs, got.log_probs)
    point = evaluate(post, "map", split)["val"]
    assert not torch.allclose(point.log_probs, got.log_probs)
    assert got.metrics["n_samples"] == 4


def test_mc_dropout_without_dropout_is_an_error(
    tiny_posteriors: Any, mnist5k_prepared: Any
) -> None:
    post = _dropout_posterior(tiny_posteriors, 0.0)
    with pytest.raises(UserError, match="has no dropout"):
        evaluate(post, "mc_dropout", _split(post, mnist5k_prepared.prepared))
    sgd = {"sgd": dict(SGD)}
    with pytest.raises(UserError, match="mc_dropout needs dropout"):
        _params(sgd, {"m": {"trajectory": "sgd", "method": "mc_dropout"}})
    ok = _params(
        {"sgd": {**SGD, "dropout": 0.2}}, {"m": {"trajectory": "sgd", "method": "mc_dropout"}}
    )
    assert ok.dropout_of("sgd") == 0.2


# --- deep ensembles ----------------------------------------------------------


def test_ensemble_of_one_member_is_the_single_model(mnist5k_prepared: Any) -> None:
    prepared = mnist5k_prepared.prepared
    single = _params({"x": dict(SGD)}, {"x": {"trajectory": "x", "method": "map"}})
    ensemble = _params(
        {"x": {**SGD, "kind": "ensemble", "members": 1}},
        {"x": {"trajectory": "x", "method": "ensemble"}},
    )
    start = pretrain(single, prepared, CPU).posterior
    one = finetune(single, "x", prepared, start, CPU).posterior
    many = finetune(ensemble, "x", prepared, start, CPU).posterior
    assert torch.equal(one.theta, many.theta)
    assert many.samples is not None and many.samples["theta"].shape == (1, one.theta.numel())
    split = _split(one, prepared)
    as_map = evaluate(one, "map", split)["val"]
    as_ensemble = evaluate(many, "ensemble", split, n_samples=30)["val"]
    assert torch.equal(as_map.log_probs, as_ensemble.log_probs)
    assert as_ensemble.metrics["n_samples"] == 1


def test_ensemble_members_are_distinct_runs_averaged_in_probability(
    mnist5k_prepared: Any,
) -> None:
    prepared = mnist5k_prepared.prepared
    params = _params(
        {"sgd": dict(SGD), "ens": {**SGD, "kind": "ensemble", "members": 2}},
        {"ens": {"trajectory": "ens", "method": "ensemble"}},
        members=2,
    )
    start = pretrain_members(params, prepared, CPU).posterior
    assert start.samples is not None
    first = pretrain(params, prepared, CPU).posterior
    other = pretrain(params, prepared, CPU, member=1).posterior
    assert torch.equal(start.theta, first.theta)
    assert torch.equal(start.samples["theta"], torch.stack([first.theta, other.theta]))
    assert not torch.equal(first.theta, other.theta)
    post = finetune(params, "ens", prepared, start, CPU).posterior
    assert post.samples is not None
    members = post.samples["theta"]
    assert members.shape[0] == 2 and not torch.equal(members[0], members[1])
    with pytest.raises(UserError, match="the start has 1 "):
        finetune(params, "ens", prepared, first, CPU)
    split = _split(post, prepared)
    got = evaluate(post, "ensemble", split)["val"]
    brute = []
    for theta in members:
        model = post.build_model()
        load_theta(model, theta, {})
        brute.append(_probs(model.eval(), split["val"][0]))
    torch.testing.assert_close(got.log_probs, torch.stack(brute).mean(0).log(), rtol=0, atol=1e-9)
    x, y = split["val"]
    sharp = centre_sharpness(
        post, "ensemble", x, y, bn_x=None, rho=0.05, probes=1, seed=0, device=CPU
    )["sharpness"]
    per_member = []
    for theta, buffers in centres(post, method_of("ensemble")):
        model = post.build_model()
        load_theta(model, theta, buffers or {})
        per_member.append(sam_sharpness(model, x, y, 0.05))
    assert sharp == pytest.approx(sum(per_member) / 2, rel=1e-6)


def test_ensemble_params_are_checked() -> None:
    with pytest.raises(UserError, match=r"members: 3 members need pretrain.members >= 3"):
        _params({"e": {**SGD, "kind": "ensemble", "members": 3}}, {}, members=2)
    with pytest.raises(UserError, match="members: set it for ensemble trajectories"):
        _params({"e": {**SGD, "kind": "ensemble"}}, {})
    with pytest.raises(UserError, match="members: set it for ensemble trajectories"):
        _params({"e": {**SGD, "members": 3}}, {})
    with pytest.raises(
        UserError, match=r"method: ensemble needs ensemble members \(an ensemble trajectory\)"
    ):
        _params({"e": dict(SGD)}, {"p": {"trajectory": "e", "method": "ensemble"}})


# --- SGLD --------------------------------------------------------------------


def test_sgld_step_is_the_drift_plus_noise_of_scale_sqrt_2lr_over_n() -> None:
    gen = torch.Generator().manual_seed(0)
    p = nn.Parameter(torch.randn(1000, generator=gen))
    grad = torch.randn(1000, generator=gen)
    p.grad = grad.clone()
    before = p.detach().clone()
    opt = SGLD([p], n_train=500, lr=0.02, weight_decay=0.1)
    torch.manual_seed(3)
    opt.step()
    torch.manual_seed(3)
    noise = torch.randn(1000)
    expected = before - 0.02 * (grad + 0.1 * before) + math.sqrt(2 * 0.02 / 500) * noise
    torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-6)


def test_sgld_noise_scale_statistics() -> None:
    p = nn.Parameter(torch.zeros(1_000_000, dtype=torch.float64))
    p.grad = torch.zeros_like(p)
    opt = SGLD([p], n_train=3200, lr=0.01)
    torch.manual_seed(0)
    opt.step()
    expected = math.sqrt(2 * 0.01 / 3200)
    assert opt.noise_std(0.01) == pytest.approx(expected)
    # The sample std of 1e6 normals is within 0.5% with overwhelming probability.
    assert p.detach().std().item() == pytest.approx(expected, rel=5e-3)
    assert abs(p.detach().mean().item()) < 5 * expected / 1000


def test_sgld_samples_the_gaussian_posterior_of_a_quadratic() -> None:
    """Per-datum loss theta^2 / (2 N v): posterior N(0, v); the chain's exact stationary
    variance with step a = lr / (N v) is v / (1 - a / 2)."""
    n_train, v, lr = 100, 0.5, 5.0
    a = lr / (n_train * v)
    theta = nn.Parameter(torch.zeros(20_000, dtype=torch.float64))
    opt = SGLD([theta], n_train=n_train, lr=lr)
    torch.manual_seed(0)
    draws = []
    for step in range(600):
        opt.zero_grad()
        (theta.pow(2).sum() / (2 * n_train * v)).backward()
        opt.step()
        if step >= 200 and step % 20 == 0:
            draws.append(theta.detach().var().item())
    assert sum(draws) / len(draws) == pytest.approx(v / (1 - a / 2), rel=0.02)


def test_sgld_trajectory_keeps_the_last_samples(
    mnist5k_prepared: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = mnist5k_prepared.prepared
    collected: list[torch.Tensor] = []  # every sample the chain offered, in order
    append = KeptSamples.append

    def spy(self: KeptSamples, theta: torch.Tensor) -> None:
        collected.append(theta.detach().cpu().clone())
        append(self, theta)

    monkeypatch.setattr(KeptSamples, "append", spy)
    sgld = {
        **SGD,
        "kind": "sgld",
        "epochs": 2,
        "momentum": 0.0,
        "schedule": {"kind": "constant", "lr": 0.01},
        "collect": {"start_epoch": 1, "every": 5, "max_rank": 3},
    }
    params = _params(
        {"sgld": sgld, "f_sgld": {**sgld, "sam_rho": 0.05}},
        {"sgld": {"trajectory": "sgld", "method": "sgld"}},
    )
    start = pretrain(params, prepared, CPU).posterior
    post = finetune(params, "sgld", prepared, start, CPU).posterior
    assert post.samples is not None and post.samples["buffers"] is None
    thetas = post.samples["theta"]
    assert thetas.shape == (3, start.theta.numel())
    # one every 5 steps of the second epoch: more than kept, so "last" is tested
    assert len(collected) == math.ceil(math.ceil(len(prepared.train) / 128) / 5) > 3
    assert torch.equal(thetas, torch.stack(collected[-3:]))
    split = _split(post, prepared)
    got = evaluate(post, "sgld", split, n_samples=2)["val"]
    assert got.metrics["n_samples"] == 2
    brute = []
    for theta in thetas[-2:]:
        model = post.build_model()
        load_theta(model, theta, {})
        brute.append(_probs(model.eval(), split["val"][0]))
    torch.testing.assert_close(got.log_probs, torch.stack(brute).mean(0).log(), rtol=0, atol=1e-9)
    assert evaluate(post, "sgld", split, n_samples=30)["val"].metrics["n_samples"] == 3
    flat = finetune(params, "f_sgld", prepared, start, CPU).posterior
    assert flat.samples is not None and torch.isfinite(flat.samples["theta"]).all()
    assert not torch.equal(flat.samples["theta"], thetas)


def test_sgld_params_are_checked() -> None:
    sgld = {
        **SGD,
        "kind": "sgld",
        "momentum": 0.0,
        "collect": {"start_epoch": 0, "every": 5, "max_rank": 3},
    }
    with pytest.raises(UserError, match="momentum: must be 0 for sgld"):
        _params({"s": {**sgld, "momentum": 0.9}}, {})
    with pytest.raises(UserError, match="collect: an sgld trajectory needs"):
        _params({"s": {k: v for k, v in sgld.items() if k != "collect"}}, {})
    with pytest.raises(UserError, match=r"method: sgld needs SGLD samples \(an sgld trajectory\)"):
        _params({"s": dict(SGD)}, {"p": {"trajectory": "s", "method": "sgld"}})


@pytest.mark.parametrize("reset", [False, True])
def test_hwa_averages_passively_unless_reset(mnist5k_prepared: Any, reset: bool) -> None:
    """ALGORITHMS §4: the HWA trajectory is not reset to its average (passive, like SWA);
    ``reset_to_average`` restarts it from (mu_bar, sqrt(v_bar)) at every snapshot."""
    prepared = mnist5k_prepared.prepared
    steps = math.ceil(len(prepared.train) / 128)  # one cycle an epoch: snapshots at 1 and 2
    vi = {"vi": {"sigma_init": 0.03, "prior_sigma": 1.0, "optimizer": "adam"}}
    base = {**SGD, "momentum": 0.0, "weight_decay": 0.0, **vi}
    hwa = {
        **base,
        "kind": "hwa",
        "start": "vi",
        "epochs": 2,
        "schedule": {"kind": "cyclic", "lr": 0.001, "lr_end": 0.0001, "cycle_length": steps},
        "collect": {"start_epoch": 0, "every": 0, "max_rank": 5},
        "reset_to_average": reset,
    }
    params = _params({"vi": {**base, "kind": "vi"}, "hwa": hwa}, {})
    start = pretrain(params, prepared, CPU).posterior
    post = finetune(params, "vi", prepared, start, CPU).posterior
    post = finetune(params, "hwa", prepared, post, CPU).posterior
    found = HWA.from_state_dict(post.hwa)
    assert found.n_collected == 2
    at_average = torch.allclose(post.theta, found.mu.mean.float(), rtol=0, atol=1e-6)
    assert at_average == reset
    if reset:
        sigma = torch.nn.functional.softplus(post.rho.double())
        torch.testing.assert_close(sigma**2, found.var.mean.double(), rtol=1e-4, atol=1e-12)
