"""LeNet-5's max pooling: the strided-maximum forward gives nn.MaxPool2d's bytes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bayesavg.models import build_model
from bayesavg.models.small import MaxPool2x2


def _inputs(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random values with ties inside windows (exact zeros after ReLU, repeated values)
    and a NaN: the cases where a maximum could be taken from the wrong place."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.relu(torch.randn(shape, generator=gen))
    h, w = shape[-2] // 2 * 2, shape[-1] // 2 * 2
    corner, other = x[..., 0:h:2, 0:w:2], x[..., 1:h:2, 1:w:2]
    tie = torch.rand(other.shape, generator=gen) < 0.2
    x[..., 1:h:2, 1:w:2] = torch.where(tie, corner, other)
    x.view(-1)[x.numel() // 2] = float("nan")
    return x


@pytest.mark.parametrize("shape", [(1, 1, 2, 2), (5, 6, 28, 28), (3, 16, 10, 10)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_inference_forward_is_max_pool_bitwise(shape: tuple[int, ...], channels_last: bool) -> None:
    x = _inputs(shape, seed=len(shape) + shape[0])
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    expected = F.max_pool2d(x, 2)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            got = MaxPool2x2()(x)
        assert got.shape == expected.shape
        assert torch.equal(got.isnan(), expected.isnan())
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(expected))


def test_with_autograd_it_is_max_pool_gradient_included() -> None:
    """Training and sharpness take nn.MaxPool2d's path: the gradient goes to the first
    maximum of each window, ties included."""
    x0 = torch.nan_to_num(_inputs((4, 6, 12, 12), seed=1))
    grad = torch.randn(4, 6, 6, 6, generator=torch.Generator().manual_seed(2))
    results = []
    for pool in (nn.MaxPool2d(2), MaxPool2x2()):
        x = x0.clone().requires_grad_()
        y = pool(x)
        y.backward(grad)
        results.append((y.detach(), x.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_odd_sizes_take_max_pool_itself() -> None:
    x = _inputs((2, 3, 7, 9), seed=3)
    with torch.no_grad():
        got = MaxPool2x2()(x)
    expected = F.max_pool2d(x, 2)
    assert got.shape == (2, 3, 3, 4)
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(expected))


def test_lenet5_predicts_what_it_did_with_max_pool() -> None:
    torch.manual_seed(0)
    model = build_model("lenet5", (1, 28, 28), 10).eval()
    plain = build_model("lenet5", (1, 28, 28), 10).eval()
    plain.load_state_dict(model.state_dict())
    for i, layer in enumerate(plain):
        if isinstance(layer, MaxPool2x2):
            plain[i] = nn.MaxPool2d(2)
    assert sum(isinstance(m, MaxPool2x2) for m in model.modules()) == 2
    x = torch.randn(64, 1, 28, 28, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        assert torch.equal(model(x), plain(x))
