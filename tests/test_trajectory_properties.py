"""Properties of ``bayesavg.trajectories`` that the end-to-end tests leave open: what a
run's history rows measure, per-run seeding, and that each kind's plan takes the
hyperparameters its params give (momentum, weight decay, VI's prior and KL weight, F-VI's
radius, continuing VI's variances)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from pipeline_repo import small_params
from torch import nn

from bayesavg import trajectories
from bayesavg.config import parse_params
from bayesavg.posteriors import HWA, MeanFieldVI, svi_step
from bayesavg.posteriors.file import PosteriorFile
from bayesavg.posteriors.swag import SWAG
from bayesavg.posteriors.vi import softplus_inverse
from bayesavg.training import train as train_module
from bayesavg.training.augment import Augment, EpochDraws, draw_epoch
from bayesavg.training.batches import Tensors
from bayesavg.training.flat import params_vector
from bayesavg.training.steps import StepContext
from bayesavg.training.train import Compute, loss_and_accuracy
from bayesavg.trajectories import _mean_history, finetune, gradient, variational
from bayesavg.trajectories.common import (
    compute_for,
    finetune_seed,
    start_model,
    trajectory_kwargs,
)
from bayesavg.trajectories.from_weights import frozen_except
from bayesavg.trajectories.gradient import KeptSamples
from bayesavg.trajectories.sgld import SGLD

CPU = torch.device("cpu")
BASE = {"start": "pretrain", "epochs": 2, "batch_size": 256, "momentum": 0.9}
INFO: dict[str, Any] = {
    "trajectory": "t",
    "model_name": "mlp",
    "model_kwargs": {},
    "input_shape": (4,),
    "mean": [0.0],
    "std": [1.0],
    "num_classes": 3,
    "data": {},
}
VI = {"sigma_init": 0.02, "prior_sigma": 0.5, "mc_samples": 2, "kl_weight": 0.3}


def _params(finetune: dict[str, Any], **top: Any) -> Any:
    """``small_params`` (a BatchNorm MLP on mnist5k) with these trajectories only."""
    raw = small_params(epochs=2, pretrain_epochs=1, members=2)
    raw["finetune"] = finetune
    raw["evaluate"]["predictors"] = {}
    raw["evaluate"]["plane"]["trajectories"] = []
    land = raw["evaluate"]["landscape"]
    land["lines"], land["rays"]["centres"], land["swag"]["trajectories"] = {}, [], []
    raw["evaluate"]["dswag_sweep"]["workers"] = []
    raw.update(top)
    return parse_params(raw)


def _file(theta: torch.Tensor, **fields: Any) -> PosteriorFile:
    """A posterior file of ``theta`` with placeholder descriptive fields."""
    return PosteriorFile(theta=theta, buffers={}, **{**INFO, **fields})


def _eval(post: PosteriorFile, split: Any) -> tuple[float, float]:
    model = post.build_model()
    loss, acc = loss_and_accuracy(model, Tensors(post.model_input(split.x), split.y))
    return loss.item(), acc.item()


# --- a run's history -----------------------------------------------------------------


@pytest.fixture(scope="module")
def collecting_run(mnist5k_prepared: Any, short_starts: dict[str, PosteriorFile]) -> Any:
    """Two epochs of SGD on a cosine rate, one SWAG snapshot per epoch from epoch 1 on."""
    traj = {
        **BASE,
        "weight_decay": 0.0005,
        "schedule": {"kind": "cosine", "lr": 0.01, "lr_end": 0.0001},
        "collect": {"start_epoch": 1, "every": 0, "max_rank": 4},
    }
    params = _params({"s": traj})
    start = short_starts["pretrain"]
    return start, finetune(params, "s", mnist5k_prepared.prepared, start, CPU)


def test_a_cosine_run_ends_at_lr_end(collecting_run: Any) -> None:
    """The last optimizer step of the run takes lr_end (the schedule spans the run's
    iterations exactly)."""
    _, result = collecting_run
    assert result.history[-1]["lr"] == pytest.approx(0.0001, rel=1e-9)
    assert result.history[0]["lr"] > 0.0001


def test_curves_measure_the_final_network_on_validation_and_test(
    collecting_run: Any, mnist5k_prepared: Any
) -> None:
    """The last row's val_* are the final network's on the validation split, test_* on
    the test split (not one for the other)."""
    _, result = collecting_run
    prepared, row = mnist5k_prepared.prepared, result.history[-1]
    val_loss, val_acc = _eval(result.posterior, prepared.val)
    test_loss, test_acc = _eval(result.posterior, prepared.test)
    assert row["val_loss"] == pytest.approx(val_loss, rel=1e-6)
    assert row["val_accuracy"] == pytest.approx(val_acc, abs=1e-12)
    assert row["test_loss"] == pytest.approx(test_loss, rel=1e-6)
    assert row["test_accuracy"] == pytest.approx(test_acc, abs=1e-12)
    assert val_loss != pytest.approx(test_loss, rel=1e-6)


def test_the_average_curve_is_empty_before_the_first_snapshot(collecting_run: Any) -> None:
    """With start_epoch 1 the first snapshot follows epoch 2's last step: epoch 1's row
    has no running average to evaluate, a NaN, not the loss of an all-zero network. The
    file keeps the start's weights (``start_theta``) for the report."""
    start, result = collecting_run
    first, second = result.history
    assert math.isnan(first["avg_test_loss"]) and math.isnan(first["avg_test_accuracy"])
    assert math.isfinite(second["avg_test_loss"])
    assert result.posterior.collector["n_collected"] == 1
    assert torch.equal(result.posterior.start_theta, start.theta)


def test_collection_counts_the_loops_batches_under_batchnorm(
    mnist5k_prepared: Any, short_starts: dict[str, PosteriorFile]
) -> None:
    """n = k * batch_size + 1 on a BatchNorm network: the lone last example joins the
    batch before, so an epoch has k steps and "one snapshot per epoch" is one per k."""
    n = len(mnist5k_prepared.prepared.train)
    batch_size = n - 1  # one batch of n - 1, then one of 1: a single step an epoch
    traj = {
        **BASE,
        "batch_size": batch_size,
        "schedule": {"kind": "constant", "lr": 0.001},
        "collect": {"start_epoch": 0, "every": 0, "max_rank": 4},
    }
    post = finetune(
        _params({"s": traj}), "s", mnist5k_prepared.prepared, short_starts["pretrain"], CPU
    ).posterior
    assert post.collector["n_collected"] == 2


def test_each_run_shuffles_from_its_own_seed(
    mnist5k_prepared: Any, short_starts: dict[str, PosteriorFile]
) -> None:
    """Two trajectories alike but for their names end elsewhere: each run's data order
    comes from (seed, its name); an ensemble member's seed is its own too."""
    traj = {**BASE, "epochs": 1, "schedule": {"kind": "constant", "lr": 0.01}}
    params = _params({"a": dict(traj), "b": dict(traj)})
    prepared, start = mnist5k_prepared.prepared, short_starts["pretrain"]
    a = finetune(params, "a", prepared, start, CPU).posterior
    b = finetune(params, "b", prepared, start, CPU).posterior
    assert not torch.equal(a.theta, b.theta)
    seeds = {finetune_seed(0, "a", m) for m in range(3)} | {finetune_seed(0, "b")}
    assert len(seeds) == 4


def test_each_run_augments_from_its_own_seed(
    mnist5k_prepared: Any, short_starts: dict[str, PosteriorFile], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two trajectories alike but for their names draw different crops and flips."""
    drawn: list[torch.Tensor] = []

    def spy(n: int, aug: Augment, generator: torch.Generator) -> EpochDraws:
        draws = draw_epoch(n, aug, generator)
        drawn.append(torch.cat([draws.top, draws.left, draws.flip.long()]))
        return draws

    monkeypatch.setattr(train_module, "draw_epoch", spy)
    traj = {**BASE, "epochs": 1, "schedule": {"kind": "constant", "lr": 0.01}}
    raw_data = small_params(epochs=2, pretrain_epochs=1, members=1)["data"]
    raw_data["augment"] = {"crop_padding": 2, "flip": True}
    params = _params({"a": dict(traj), "b": dict(traj)}, data=raw_data)
    prepared, start = mnist5k_prepared.prepared, short_starts["pretrain"]
    for name in ("a", "b"):
        finetune(params, name, prepared, start, CPU)
    assert len(drawn) == 2
    assert not torch.equal(drawn[0], drawn[1])


def test_ensemble_member_m_starts_from_pretrained_member_m(
    mnist5k_prepared: Any, short_starts: dict[str, PosteriorFile], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Member m's run starts from pretrained member m's weights and BatchNorm buffers, and
    at a negligible rate it ends there: not at member 0's network."""
    traj = {
        **BASE,
        "kind": "ensemble",
        "members": 2,
        "epochs": 1,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "schedule": {"kind": "constant", "lr": 1e-12},
    }
    start = short_starts["pretrain"]
    origins: list[PosteriorFile] = []

    def spy(origin: PosteriorFile, kwargs: dict[str, Any], device: torch.device) -> nn.Module:
        origins.append(origin)
        return start_model(origin, kwargs, device)

    monkeypatch.setattr(trajectories, "start_model", spy)
    post = finetune(_params({"e": traj}), "e", mnist5k_prepared.prepared, start, CPU).posterior
    pretrained = start.samples["theta"]
    assert len(origins) == 2
    for member, origin in enumerate(origins):
        assert torch.equal(origin.theta, pretrained[member])
        for key, value in start.samples["buffers"][member].items():
            assert torch.equal(origin.buffers[key], value), key
    assert not torch.allclose(pretrained[0], pretrained[1])
    torch.testing.assert_close(post.samples["theta"], pretrained, rtol=0, atol=1e-6)


def test_ensemble_history_is_the_mean_of_the_members() -> None:
    rows = _mean_history(
        [
            [{"epoch": 1, "val_loss": 1.0}, {"epoch": 2, "val_loss": 0.5}],
            [{"epoch": 1, "val_loss": 3.0}, {"epoch": 2, "val_loss": 1.5}],
        ]
    )
    assert rows == [{"epoch": 1, "val_loss": 2.0}, {"epoch": 2, "val_loss": 1.0}]


# --- what a run starts from -----------------------------------------------------------


def test_the_start_network_has_the_starts_batchnorm_statistics(
    short_starts: dict[str, PosteriorFile],
) -> None:
    start = short_starts["pretrain"]
    model = start_model(start, start.model_kwargs, CPU)
    assert model.training
    assert torch.equal(params_vector(model.parameters()).detach(), start.theta)
    buffers = dict(model.named_buffers())
    assert start.buffers and all(torch.equal(buffers[k], v) for k, v in start.buffers.items())


def test_a_trajectorys_own_dropout_overrides_the_starts_even_when_zero() -> None:
    start = _file(torch.zeros(1), model_kwargs={"dropout": 0.3})
    assert trajectory_kwargs(start, 0.0)["dropout"] == 0.0
    assert trajectory_kwargs(start, 0.1)["dropout"] == 0.1
    assert trajectory_kwargs(start, None)["dropout"] == 0.3


def test_channels_last_auto_is_on_false_is_off() -> None:
    raw = small_params(epochs=2, pretrain_epochs=1, members=1)
    for setting, expected in (("auto", True), (True, True), (False, False)):
        raw["channels_last"] = setting
        assert compute_for(parse_params(raw), CPU).channels_last is expected


# --- gradient kinds -------------------------------------------------------------------


def _plan(traj: dict[str, Any], covers: list[str] | None = None) -> tuple[Any, nn.Module]:
    params = _params({"t": traj})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    opts = params.finetune["t"]
    return gradient.plan(opts, model, Compute(), StepContext(), 123, covers), model


def test_sgd_plans_take_the_trajectorys_momentum_and_weight_decay() -> None:
    plan, _ = _plan({**BASE, "momentum": 0.7, "weight_decay": 0.003})
    group = plan.optimizer.param_groups[0]
    assert (group["momentum"], group["weight_decay"]) == (0.7, 0.003)


def test_sgld_plans_take_the_training_size_and_weight_decay() -> None:
    traj = {
        **BASE,
        "kind": "sgld",
        "momentum": 0.0,
        "weight_decay": 0.003,
        "schedule": {"kind": "constant", "lr": 0.01},
        "collect": {"start_epoch": 0, "every": 5, "max_rank": 3},
    }
    plan, _ = _plan(traj)
    assert isinstance(plan.optimizer, SGLD)
    assert plan.optimizer.n_train == 123
    assert plan.optimizer.param_groups[0]["weight_decay"] == 0.003


def test_sgld_refuses_an_empty_training_set_and_negative_decay() -> None:
    p = [nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="n_train"):
        SGLD(p, n_train=0)
    with pytest.raises(ValueError, match="weight_decay"):
        SGLD(p, n_train=10, weight_decay=-1.0)


def test_kept_samples_average_is_the_mean_of_the_kept_ones() -> None:
    kept = KeptSamples(2, CPU)
    assert kept.mean() is None
    for value in (1.0, 2.0, 4.0):
        kept.append(torch.full((3,), value))
    assert torch.equal(kept.mean(), torch.full((3,), 3.0))


def test_a_scoped_average_is_the_covered_mean_and_the_rest_as_it_is() -> None:
    """With ``covers``, the monitoring average puts the covered weights' running mean
    in their places and keeps the current value of every other weight."""
    traj = {**BASE, "collect": {"start_epoch": 0, "every": 1, "max_rank": 2}}
    plan, model = _plan(traj, covers=["2.weight", "2.bias"])
    assert plan.average() is None
    plan.collect()
    with torch.no_grad():
        model[2].weight.add_(1.0)
        model[0].weight.add_(1.0)
    plan.collect()
    got = plan.average()
    whole = params_vector(model.parameters()).detach()
    head = model[0].weight.numel() + model[0].bias.numel()
    swag: SWAG = plan.parts["collector"]
    torch.testing.assert_close(got[:head], whole[:head])
    torch.testing.assert_close(got[head:], swag.mean.float())
    assert not torch.allclose(got[head:], whole[head:])


# --- variational kinds ----------------------------------------------------------------


def _vi_traj(**extra: Any) -> dict[str, Any]:
    return {
        **BASE,
        "kind": "vi",
        "momentum": 0.0,
        "weight_decay": 0.0,
        "schedule": {"kind": "constant", "lr": 0.001},
        "vi": {**VI, "optimizer": "adam"},
        **extra,
    }


def test_the_vi_step_is_the_configured_negative_elbo() -> None:
    """The plan's step is ``svi_step`` with the trajectory's KL weight, MC samples and
    SAM radius, on a ``MeanFieldVI`` with its prior; its optimizer has its weight decay."""
    traj = _params({"t": _vi_traj(sam_rho=0.05)}).finetune["t"]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    reference = MeanFieldVI(copy.deepcopy(net), 0.02, 0.5)
    start = _file(params_vector(net.parameters()).detach())
    plan = variational.plan(traj, net, Compute(), StepContext(), 50, start)
    assert plan.trained.prior_sigma == 0.5
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    torch.manual_seed(2)
    loss, _ = plan.step(plan.trained, x, y)
    torch.manual_seed(2)
    want, _ = svi_step(50, 0.3, 2, 0.05)(reference, x, y)
    assert torch.equal(loss, want)
    assert torch.equal(plan.trained.mu.grad, reference.mu.grad)
    assert torch.equal(plan.trained.rho.grad, reference.rho.grad)


def test_hwa_continues_the_vi_variances_and_keeps_the_last_k() -> None:
    """An hwa run starts from its start's rho (the vi solution, ALGORITHMS §4), keeps
    ``collect.max_rank`` deviations, and its file records the chain's first sigma."""
    hwa = _vi_traj(
        kind="hwa",
        start="v",
        schedule={"kind": "cyclic", "lr": 0.001, "lr_end": 0.0001, "cycle_length": 5},
        collect={"start_epoch": 0, "every": 0, "max_rank": 3},
    )
    traj = _params({"v": _vi_traj(), "t": hwa}).finetune["t"]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    theta = params_vector(net.parameters()).detach()
    rho = softplus_inverse(torch.linspace(0.01, 0.05, theta.numel()))
    start = _file(theta, rho=rho, extra={"sigma_init": 0.04})
    plan = variational.plan(traj, net, Compute(), StepContext(), 50, start)
    assert torch.equal(plan.trained.rho.detach(), rho)
    collector: HWA = plan.parts["collector"]
    for _ in range(5):
        plan.collect()
    assert collector.mu.deviations.shape[0] == 3
    post = variational.finish(plan, net, dict(INFO), start, 0.02)
    assert post.extra["sigma_init"] == 0.04
    assert torch.equal(post.rho, rho)


# --- a head fit on given weights ------------------------------------------------------


def test_a_nested_head_trains_while_the_rest_stays_in_eval_mode() -> None:
    """The head "1.1" sits inside module "1": the parent is not pinned, so ``train()``
    reaches the head; on leaving, every pinned module's mode is what it was."""
    model = nn.Sequential(
        nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5)),
        nn.Sequential(nn.Dropout(0.5), nn.Linear(6, 3)),
    )
    model.train()
    model[1][1].eval()
    with frozen_except(model, "1.1"):
        model.train()
        assert model[1][1].training
        assert not model[0].training and not model[0][1].training and not model[1][0].training
        assert [n for n, p in model.named_parameters() if p.requires_grad] == [
            "1.1.weight",
            "1.1.bias",
        ]
    assert model[0].training and model[0][1].training and model[1][0].training
