"""The training loop, schedules and trajectories: determinism, collection, divergence."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pipeline_repo import prune_landscape

from bayesavg.config import parse_params
from bayesavg.posteriors.file import save_posterior
from bayesavg.runtime.errors import UserError
from bayesavg.runtime.io import sha256_file
from bayesavg.training.batches import Tensors
from bayesavg.training.schedules import lr_at
from bayesavg.training.steps import sgd
from bayesavg.training.train import train
from bayesavg.trajectories import finetune, pretrain

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def _params(**overrides: Any) -> Any:
    """Default params with a small MLP and short runs."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["model"] = {"name": "mlp", "hidden": [16]}
    raw["pretrain"]["epochs"] = 1
    raw["pretrain"]["batch_size"] = 128
    for traj in raw["finetune"].values():
        if traj.get("kind") in ("dswag", "laplace"):  # no epochs: rounds, or no training
            continue
        traj["epochs"] = 2
        traj["batch_size"] = 128
        if "collect" in traj:
            traj["collect"]["start_epoch"] = 0
    raw["finetune"]["swag"]["collect"] = {"start_epoch": 1, "every": 5, "max_rank": 3}
    for key, value in overrides.items():
        raw[key] = value
    return parse_params(raw)


def test_pretraining_is_bitwise_deterministic(mnist5k_prepared: Any, tmp_path: Path) -> None:
    params = _params()
    digests = []
    for run in range(2):
        result = pretrain(params, mnist5k_prepared.prepared, CPU)
        save_posterior(tmp_path / f"run{run}.pt", result.posterior)
        digests.append(sha256_file(tmp_path / f"run{run}.pt"))
    assert digests[0] == digests[1]
    other = pretrain(_params(seed=1, seeds=[1]), mnist5k_prepared.prepared, CPU)
    assert not torch.equal(other.posterior.theta, result.posterior.theta)


def test_finetune_collects_on_schedule(mnist5k_prepared: Any) -> None:
    params = _params()
    prepared = mnist5k_prepared.prepared
    start = pretrain(params, prepared, CPU).posterior
    result = finetune(params, "swag", prepared, start, CPU)
    iters_per_epoch = math.ceil(len(prepared.train) / 128)
    expected = params.finetune["swag"].snapshots(iters_per_epoch)
    # every 5 steps counted from the run's first step, from the end of epoch 1 on
    steps = range(iters_per_epoch, 2 * iters_per_epoch)
    assert expected == sum((i + 1) % 5 == 0 for i in steps)
    assert result.posterior.collector is not None
    assert result.posterior.collector["n_collected"] == expected
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert {"train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr"} <= set(
        result.history[0]
    )
    baseline = finetune(params, "sgd", prepared, start, CPU)
    assert baseline.posterior.collector is None
    assert not torch.equal(baseline.posterior.theta, start.theta)


def test_nan_loss_stops_with_epoch_and_hint() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    data = Tensors(torch.randn(32, 4) * 1e30, torch.randint(0, 3, (32,)))
    with pytest.raises(UserError, match=r"epoch 1; lower the learning rate"):
        train(
            model,
            sgd(model, 0.9, 0.0),
            data,
            epochs=3,
            batch_size=8,
            lr=lambda i: 1e10,
            generator=torch.Generator().manual_seed(0),
        )


def test_schedules() -> None:
    cyclic = lr_at("cyclic", 0.05, 0.01, 4, 100)
    assert [round(cyclic(i), 6) for i in range(5)] == [0.04, 0.03, 0.02, 0.01, 0.04]
    cosine = lr_at("cosine", 0.1, 0.001, 0, 11)
    assert cosine(0) == pytest.approx(0.1)
    assert cosine(5) == pytest.approx((0.1 + 0.001) / 2)
    assert cosine(10) == pytest.approx(0.001)
    assert lr_at("constant", 0.02, 0.0, 1, 5)(3) == 0.02


def _svi_params() -> Any:
    """Tiny params with vi and hwa trajectories (hwa continues vi) and an F-SWAG one."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["model"] = {"name": "mlp", "hidden": [16]}
    raw["pretrain"].update(epochs=1, batch_size=128)
    vi = {"sigma_init": 0.01, "prior_sigma": 1.0, "mc_samples": 1, "kl_weight": 1.0}
    svi = {"epochs": 2, "batch_size": 128, "momentum": 0.0, "weight_decay": 0.0, "vi": vi}
    raw["finetune"] = {
        "vi": {**svi, "kind": "vi", "start": "pretrain", "schedule": {"kind": "constant"}},
        "hwa": {
            **svi,
            "kind": "hwa",
            "start": "vi",
            "schedule": {"kind": "cyclic", "lr": 0.01, "lr_end": 0.001, "cycle_length": 5},
            "collect": {"start_epoch": 0, "every": 0, "max_rank": 4},
        },
        "fswag": {
            "kind": "sgd",
            "start": "pretrain",
            "epochs": 1,
            "batch_size": 128,
            "sam_rho": 0.05,
            "collect": {"start_epoch": 0, "every": 5, "max_rank": 3},
        },
    }
    raw["evaluate"]["plane"]["trajectories"] = ["hwa"]
    raw["evaluate"]["dswag_sweep"]["workers"] = []
    prune_landscape(raw)
    raw["evaluate"]["predictors"] = {
        "vi": {"vi": {"method": "vi"}},
        "hwa": {"hwa": {"method": "hwa"}},
        "fswag": {"fswag": {"method": "swag"}},
    }
    return parse_params(raw)


def test_vi_and_hwa_trajectories(mnist5k_prepared: Any) -> None:
    from bayesavg.evaluation.evaluate import evaluate
    from bayesavg.posteriors import HWA

    params = _svi_params()
    prepared = mnist5k_prepared.prepared
    start = pretrain(params, prepared, CPU).posterior
    vi = finetune(params, "vi", prepared, start, CPU).posterior
    assert vi.rho is not None and vi.hwa is None
    assert not torch.equal(vi.theta, start.theta)
    # Adam trains the variances: sigma leaves sigma_0 (recorded for the report)
    assert vi.extra["sigma_init"] == 0.01
    moved = torch.nn.functional.softplus(vi.rho) / 0.01
    assert abs(moved.median().item() - 1) > 0.1
    hwa = finetune(params, "hwa", prepared, vi, CPU).posterior
    assert hwa.extra["sigma_init"] == 0.01, "hwa continues vi's chain: vi's sigma_0"
    iters = 2 * math.ceil(len(prepared.train) / 128)
    state = HWA.from_state_dict(hwa.hwa)
    assert state.n_collected == iters // 5
    assert torch.all(state.var.mean > 0)
    x_val = hwa.model_input(prepared.val.x, CPU)
    for post, method in ((vi, "vi"), (hwa, "hwa"), (hwa, "hwa_mf"), (hwa, "hwa_rho")):
        result = evaluate(post, method, {"val": (x_val, prepared.val.y)}, n_samples=3)
        assert result["val"].metrics["accuracy"] > 0.5, method
    fswag = finetune(params, "fswag", prepared, start, CPU).posterior
    assert fswag.collector is not None and fswag.collector["n_collected"] >= 2


def _cyclic_swag(raw: dict[str, Any]) -> dict[str, Any]:
    """Cycle 6, collection from epoch 1: cycles and epochs do not line up."""
    raw = dict(raw)
    raw["schedule"] = {"kind": "cyclic", "lr": 0.05, "lr_end": 0.005, "cycle_length": 6}
    raw["collect"] = {"start_epoch": 1, "every": 0, "max_rank": 5}
    raw["epochs"] = 4
    return raw


def test_cyclic_snapshots_fall_at_cycle_ends_whatever_the_start_epoch() -> None:
    """ALGORITHMS §1/§4: snapshots at the end of each cycle, where the rate is lr_end."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["finetune"]["swag"] = _cyclic_swag(raw["finetune"]["swag"])
    traj = parse_params(raw).finetune["swag"]
    per_epoch, total = 10, 40
    lr = lr_at("cyclic", 0.05, 0.005, 6, total)
    taken = [i for i in range(total) if traj.collects_after(i, per_epoch)]
    assert taken == [11, 17, 23, 29, 35]
    assert all(lr(i) == 0.005 for i in taken)
    assert len(taken) == traj.snapshots(per_epoch)
    # counting cycles from the start epoch instead would snapshot mid-cycle
    assert lr(10 + 6 - 1) != 0.005


def test_every_collected_iterate_follows_a_step_at_lr_end(
    mnist5k_prepared: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run: the step right before each snapshot ran at lr_end."""
    from bayesavg.posteriors import SWAG
    from bayesavg.training.optim import SGD

    prepared = mnist5k_prepared.prepared
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["model"] = {"name": "mlp", "hidden": [16]}
    raw["pretrain"].update(epochs=1, batch_size=128)
    raw["finetune"]["swag"] = _cyclic_swag(raw["finetune"]["swag"])
    raw["finetune"]["swag"]["batch_size"] = math.ceil(len(prepared.train) / 10)
    params = parse_params(raw)
    rates: list[float] = []
    at_snapshot: list[float] = []
    step, collect = SGD.step, SWAG.collect

    def recording_step(self: SGD) -> None:
        rates.append(self.param_groups[0]["lr"])
        step(self)

    def recording_collect(self: SWAG, theta: Any) -> None:
        at_snapshot.append(rates[-1])
        collect(self, theta)

    monkeypatch.setattr(SGD, "step", recording_step)
    monkeypatch.setattr(SWAG, "collect", recording_collect)
    start = pretrain(params, prepared, CPU).posterior
    rates.clear()
    result = finetune(params, "swag", prepared, start, CPU)
    assert len(rates) == 40
    assert result.posterior.collector is not None
    assert result.posterior.collector["n_collected"] == len(at_snapshot) == 5
    assert at_snapshot == [0.005] * 5


def test_a_lone_last_example_joins_the_batch_before_under_batchnorm() -> None:
    """BatchNorm cannot train on one example: with n = k * batch_size + 1 a BatchNorm network
    trains k batches, the last of batch_size + 1; without BatchNorm nothing changes."""
    from bayesavg.training.batches import batches_per_epoch

    assert batches_per_epoch(91, 30) == 4
    assert batches_per_epoch(91, 30, batch_norm=True) == 3
    assert batches_per_epoch(90, 30, batch_norm=True) == 3
    assert batches_per_epoch(1, 30, batch_norm=True) == 1
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3)
    )
    data = Tensors(torch.randn(17, 4), torch.randint(0, 3, (17,)))
    sizes: list[int] = []
    model[1].register_forward_hook(lambda m, args, out: sizes.append(args[0].shape[0]))
    train(
        model,
        sgd(model, 0.9, 0.0),
        data,
        epochs=1,
        batch_size=8,
        lr=lambda i: 0.1,
        generator=torch.Generator().manual_seed(0),
    )
    assert sizes[:2] == [8, 9]
    with pytest.raises(UserError, match="one training example cannot train a BatchNorm network"):
        train(
            model,
            sgd(model, 0.9, 0.0),
            Tensors(data.x[:1], data.y[:1]),
            epochs=1,
            batch_size=8,
            lr=lambda i: 0.1,
            generator=torch.Generator().manual_seed(0),
        )
