"""update_bn gives full-data BatchNorm statistics, whatever the batching (ALGORITHMS §6)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.optim import swa_utils

from bayesavg.training.batchnorm import update_bn


def _mlp(seed: int) -> nn.Sequential:
    """Linear -> BN -> ReLU -> Linear: the BN input does not depend on the batching."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2))


def _convnet(seed: int) -> nn.Sequential:
    """Conv -> BN2d first: per-channel statistics over batch and space."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 3),
    )


def _inputs(n: int, *shape: int, seed: int) -> torch.Tensor:
    """Inputs with a drift along the data, so a short last batch is unlike the rest."""
    g = torch.Generator().manual_seed(seed)
    drift = torch.linspace(0.0, 3.0, n).reshape(n, *([1] * len(shape)))
    return torch.randn(n, *shape, generator=g) + drift


def _linear_stats(layer: nn.Linear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 full-data mean and unbiased variance of the Linear output."""
    h = x.double() @ layer.weight.double().T + layer.bias.double()
    return h.mean(0), h.var(0, unbiased=True)


def test_full_data_mean_and_unbiased_variance_with_short_last_batch() -> None:
    """N = 103, batch 20: the last batch has 3 points and must weigh 3/103, not 1/6.

    torch's update_bn (equal weight per batch, mean of per-batch variances)
    gives a visibly different answer on the same batches.
    """
    n, batch_size = 103, 20
    model = _mlp(0)
    x = _inputs(n, 4, seed=0)
    mean, var = _linear_stats(model[0], x)

    update_bn(model, x, batch_size=batch_size)
    bn = model[1]
    torch.testing.assert_close(bn.running_mean.double(), mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn.running_var.double(), var, rtol=1e-5, atol=1e-5)

    reference = _mlp(0)
    swa_utils.update_bn(list(x.split(batch_size)), reference)
    torch_bn = reference[1]
    assert (torch_bn.running_mean.double() - mean).abs().max() > 1e-2
    assert (torch_bn.running_var.double() - var).abs().max() > 1e-2


def test_previous_running_stats_do_not_leak() -> None:
    """Garbage running stats beforehand (or a first pass on other data) change nothing."""
    x = _inputs(50, 4, seed=1)
    clean = _mlp(2)
    update_bn(clean, x, batch_size=16)

    dirty = _mlp(2)
    dirty[1].running_mean.fill_(1e3)
    dirty[1].running_var.fill_(1e-3)
    update_bn(dirty, 5.0 * x + 7.0, batch_size=16)
    update_bn(dirty, x, batch_size=16)
    assert torch.equal(clean[1].running_mean, dirty[1].running_mean)
    assert torch.equal(clean[1].running_var, dirty[1].running_var)


def test_conv_bn_independent_of_batch_size() -> None:
    """BatchNorm2d statistics over (N, H, W) match brute force for every batch size."""
    n = 37
    x = _inputs(n, 2, 8, 8, seed=3)
    base = _convnet(4)
    with torch.no_grad():
        h = nn.functional.conv2d(x.double(), base[0].weight.double(), base[0].bias.double())
    per_channel = h.transpose(0, 1).reshape(4, -1)
    mean, var = per_channel.mean(1), per_channel.var(1, unbiased=True)

    results = []
    for batch_size in (1, 5, 16, 37, 100):
        model = copy.deepcopy(base)
        update_bn(model, x, batch_size=batch_size)
        results.append((model[1].running_mean.clone(), model[1].running_var.clone()))
        torch.testing.assert_close(model[1].running_mean.double(), mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model[1].running_var.double(), var, rtol=1e-5, atol=1e-5)
    for got_mean, got_var in results[1:]:
        torch.testing.assert_close(got_mean, results[0][0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got_var, results[0][1], rtol=1e-6, atol=1e-6)


def test_single_point_last_batch() -> None:
    """N = 41, batch 20: a last batch of one point is part of the training data too.

    BatchNorm1d cannot normalise one point in train mode, so the pass must
    avoid a size-1 batch; the statistics are still those of all 41 points.
    """
    model = _mlp(5)
    x = _inputs(41, 4, seed=5)
    mean, var = _linear_stats(model[0], x)
    update_bn(model, x, batch_size=20)
    torch.testing.assert_close(model[1].running_mean.double(), mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[1].running_var.double(), var, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("train", [False, True])
def test_mode_restored(train: bool) -> None:
    model = _mlp(6)
    model.train(train)
    update_bn(model, _inputs(30, 4, seed=6), batch_size=8)
    assert all(m.training is train for m in model.modules())


def test_per_module_modes_restored() -> None:
    """Fine-tuning with frozen BN (root in train, BN in eval) keeps that arrangement."""
    model = _mlp(7)
    model.train()
    model[1].eval()
    update_bn(model, _inputs(30, 4, seed=7), batch_size=8)
    assert model.training
    assert not model[1].training
    assert model[0].training


def test_model_without_batchnorm_is_untouched() -> None:
    """No BN layer: no forward pass, same parameters, same mode."""
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5), nn.Linear(3, 2)).eval()
    before = copy.deepcopy(model.state_dict())
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    update_bn(model, _inputs(20, 4, seed=8), batch_size=7)
    assert not calls
    assert not model.training
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_parameters_unchanged_and_num_batches_tracked_increments() -> None:
    model = _mlp(9)
    params = [p.detach().clone() for p in model.parameters()]
    tracked = int(model[1].num_batches_tracked)
    update_bn(model, _inputs(30, 4, seed=9), batch_size=8)
    assert int(model[1].num_batches_tracked) > tracked
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters(), strict=True))
