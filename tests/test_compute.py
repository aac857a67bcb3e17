"""The shared loop's speed features on the CPU: precision, gradient scaling, memory
layout, augmentation, and the SWAG paper's CIFAR schedule.

(CUDA-only paths, fp16 autocast and NCCL, run in ``make gpu-check``.)
"""

from __future__ import annotations

import dataclasses
import math

import dp_workers
import pytest
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from bayesavg.config import parse_params
from bayesavg.models import build_model
from bayesavg.posteriors.file import load_theta
from bayesavg.runtime.checkpoint import Checkpoint
from bayesavg.runtime.errors import UserError
from bayesavg.training.augment import Augment
from bayesavg.training.flat import params_vector
from bayesavg.training.precision import Precision, precision_for
from bayesavg.training.schedules import lr_at
from bayesavg.training.steps import StepContext, sgd_step
from bayesavg.training.train import Compute
from bayesavg.trajectories import finetune, pretrain_members, run


def _run(name: str, compute: Compute, members: int = 1, side: int = 8):
    p = dp_workers.params(members)
    data = dp_workers.prepared(side=side)
    start = pretrain_members(p, data, torch.device("cpu"), compute=Compute()).posterior
    return finetune(p, name, data, start, torch.device("cpu"), compute=compute), p, data, start


# --- precision ---------------------------------------------------------------------------


def test_fp16_needs_cuda() -> None:
    with pytest.raises(UserError, match="fp16 needs a CUDA device"):
        precision_for("fp16", "cpu")
    raw = {
        "device": "cpu",
        "precision": "fp16",
        "finetune": {"t": {"start": "pretrain"}},
        "evaluate": {"predictors": {"t": {"m": {"method": "map"}}}},
    }
    with pytest.raises(UserError, match="precision: fp16 needs a CUDA device"):
        parse_params(raw)


def test_fp32_has_no_autocast() -> None:
    x = torch.randn(4, 3)
    with Precision("fp32").autocast():
        assert nn.Linear(3, 2)(x).dtype == torch.float32
    with Precision("bf16").autocast():
        assert nn.Linear(3, 2)(x).dtype == torch.bfloat16


def test_bf16_training_keeps_fp32_weights_and_float64_moments() -> None:
    fp32, *_ = _run("swag", Compute())
    bf16, *_ = _run("swag", Compute(precision=Precision("bf16")))
    post = bf16.posterior
    assert post.theta.dtype == torch.float32
    assert post.collector["mean"].dtype == torch.float64
    assert not torch.equal(post.theta, fp32.posterior.theta)  # autocast really ran
    rel = (post.theta - fp32.posterior.theta).norm() / fp32.posterior.theta.norm()
    assert rel < 0.05  # bfloat16 has 8 bits of mantissa: close, not equal
    assert all(math.isfinite(r["train_loss"]) for r in bf16.history)


def test_the_step_sees_lower_precision_logits_but_an_fp32_loss() -> None:
    seen = {}
    model = nn.Linear(3, 2)

    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        seen["logits"] = output.dtype

    model.register_forward_hook(hook)
    ctx = StepContext(Precision("bf16"))
    loss, _ = sgd_step(model, torch.randn(4, 3), torch.tensor([0, 1, 0, 1]), ctx)
    assert seen["logits"] == torch.bfloat16
    assert loss.dtype == torch.float32
    assert model.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("name", ["swag", "fswag", "vi"])
def test_a_power_of_two_loss_scale_gives_the_unscaled_bytes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp16's GradScaler path (scaled backward, unscale, step through the scaler), run on
    the CPU with fp32 arithmetic: scaling by 2**k and back is exact, so SGD, SAM and SVI
    steps must give bitwise the unscaled result."""
    plain, *_ = _run(name, Compute())
    original = run.StepContext.__init__

    def scaled(self, precision=None, world=None, shared=None):
        original(self, precision, world, shared)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)

    monkeypatch.setattr(run.StepContext, "__init__", scaled)
    with_scaler, *_ = _run(name, Compute())
    assert torch.equal(plain.posterior.theta, with_scaler.posterior.theta)


# --- memory layout -----------------------------------------------------------------------


def test_params_vector_works_where_parameters_to_vector_fails_on_channels_last() -> None:
    torch.manual_seed(0)
    model = build_model("lenet5", (1, 28, 28), 10)
    reference = parameters_to_vector(model.parameters())
    cl = model.to(memory_format=torch.channels_last)
    assert not cl[3].weight.is_contiguous()  # 6 -> 16 channels: a real permutation
    with pytest.raises(RuntimeError):
        parameters_to_vector(cl.parameters())
    assert torch.equal(params_vector(cl.parameters()), reference)


def test_load_theta_keeps_channels_last_where_vector_to_parameters_drops_it() -> None:
    torch.manual_seed(0)
    model = build_model("lenet5", (1, 28, 28), 10).to(memory_format=torch.channels_last)
    theta = torch.randn(sum(p.numel() for p in model.parameters()))
    load_theta(model, theta, {})
    assert model[3].weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(params_vector(model.parameters()), theta)
    vector_to_parameters(theta, model.parameters())
    assert not model[3].weight.is_contiguous(memory_format=torch.channels_last)


def test_channels_last_training_matches_contiguous_training() -> None:
    """A conv net trained channels-last: SWAG collects from it and the result agrees with
    the contiguous run up to the convolution kernels' rounding."""
    p = parse_params(
        {
            **_conv_params(),
        }
    )
    data = dp_workers.prepared(side=28)
    start = pretrain_members(p, data, torch.device("cpu"), compute=Compute()).posterior
    outs = {}
    for cl in (False, True):
        result = finetune(
            p, "swag", data, start, torch.device("cpu"), compute=Compute(channels_last=cl)
        )
        outs[cl] = result.posterior
    rel = (outs[True].theta - outs[False].theta).norm() / outs[False].theta.norm()
    assert rel < 1e-4
    assert outs[True].collector["n_collected"] == 3


def _conv_params() -> dict:
    raw = dp_workers.params(1).model_dump()
    raw["model"] = {"name": "lenet5"}
    raw["finetune"] = {"swag": raw["finetune"]["swag"]}
    return _strip_none(raw)


def _strip_none(node):
    if isinstance(node, dict):
        return {k: _strip_none(v) for k, v in node.items() if v is not None}
    return node


# --- augmentation ------------------------------------------------------------------------


AUG = Augment(crop_padding=2, flip=True)


def test_augmented_runs_are_deterministic_and_differ_from_plain() -> None:
    a, *_ = _run("swag", Compute(augment=AUG))
    b, *_ = _run("swag", Compute(augment=AUG))
    plain, *_ = _run("swag", Compute())
    assert torch.equal(a.posterior.theta, b.posterior.theta)
    assert not torch.equal(a.posterior.theta, plain.posterior.theta)


def test_a_resumed_augmented_run_is_bitwise_the_uninterrupted_one(tmp_path) -> None:
    whole, p, data, start = _run("swag", Compute(augment=AUG))
    ckpt = Checkpoint(tmp_path / "ckpt.pt", "key", every=1)
    compute = Compute(augment=AUG)
    dev = torch.device("cpu")
    dp_workers._interrupted(2, lambda: finetune(p, "swag", data, start, dev, ckpt, compute))
    assert ckpt.load() is not None
    resumed = finetune(p, "swag", data, start, dev, ckpt, compute)
    assert torch.equal(whole.posterior.theta, resumed.posterior.theta)
    assert torch.equal(whole.posterior.collector["mean"], resumed.posterior.collector["mean"])


# --- the SWAG paper's CIFAR schedule -----------------------------------------------------


def _reference_schedule(epoch: int, lr_init: float, swa_lr: float | None, span: int) -> float:
    """run_swag.py's ``schedule(epoch)``, as published (swa_lr None: the SGD baseline)."""
    t = epoch / span
    lr_ratio = swa_lr / lr_init if swa_lr is not None else 0.01
    if t <= 0.5:
        factor = 1.0
    elif t <= 0.9:
        factor = 1.0 - (1.0 - lr_ratio) * (t - 0.5) / 0.4
    else:
        factor = lr_ratio
    return lr_init * factor


@pytest.mark.parametrize(
    ("lr_init", "swa_lr", "decay"),
    [(0.1, 0.01, 161), (0.05, 0.01, 161), (0.1, 0.05, 161), (0.1, None, None)],
)
def test_swag_schedule_follows_run_swag_per_epoch(lr_init, swa_lr, decay) -> None:
    """PreResNet-164 / VGG-16 / CIFAR-100 SWAG runs and the SGD baseline (0.01 lr_init
    over all 300 epochs), at 391 iterations per epoch (CIFAR, batch 128)."""
    per_epoch, epochs = 391, 300
    end = swa_lr if swa_lr is not None else 0.01 * lr_init
    rate = lr_at("swag", lr_init, end, 1, epochs * per_epoch, per_epoch, decay)
    span = decay or epochs
    for epoch in range(epochs):
        expected = _reference_schedule(epoch, lr_init, swa_lr, span)
        for i in (epoch * per_epoch, epoch * per_epoch + per_epoch - 1):
            assert rate(i) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_swag_schedule_in_a_run_sets_the_epoch_rate() -> None:
    raw = _strip_none(dp_workers.params(1).model_dump())
    raw["finetune"]["swag"]["schedule"] = {
        "kind": "swag",
        "lr": 0.1,
        "lr_end": 0.01,
        "decay_epochs": 2,
    }
    p = parse_params(raw)
    data = dp_workers.prepared()
    start = pretrain_members(p, data, torch.device("cpu")).posterior
    result = finetune(p, "swag", data, start, torch.device("cpu"))
    assert [r["lr"] for r in result.history] == pytest.approx(
        [_reference_schedule(e, 0.1, 0.01, 2) for e in range(3)]
    )


def test_decay_epochs_only_for_the_swag_schedule() -> None:
    raw = _strip_none(dp_workers.params(1).model_dump())
    raw["finetune"]["swag"]["schedule"] = {"kind": "cosine", "lr": 0.1, "decay_epochs": 2}
    with pytest.raises(UserError, match="decay_epochs: only the swag schedule takes it"):
        parse_params(raw)


def test_compute_is_a_frozen_value() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Compute().channels_last = True  # type: ignore[misc]


def test_published_normalisation_for_known_datasets_else_the_splits_own() -> None:
    from bayesavg.data.prepared import channel_stats, normalisation

    x = torch.randint(0, 256, (20, 3, 4, 4), dtype=torch.uint8)
    assert normalisation("cifar10", x) == ([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010])
    assert normalisation("cifar100", x) == normalisation("cifar10", x)
    assert normalisation("imagefolder:/x", x) == channel_stats(x)
    assert normalisation("mnist5k", x[:, :1]) == channel_stats(x[:, :1])
