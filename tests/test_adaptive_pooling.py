"""Adaptive pooling without ``adaptive_avg_pool2d``'s backward (models/pooling.py): it
has no deterministic CUDA kernel, so torchvision's VGG and AlexNet would stop at their
first backward on a GPU. The CPU checks: the same values (bitwise where the windows
tile the input), the same gradients, and no adaptive-pooling node left in the graph."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from bayesavg.models import build_model
from bayesavg.models.pooling import DeterministicAdaptiveAvgPool2d, deterministic_pooling

SHAPES = [
    (14, 14, 7),  # windows tile the input: avg_pool2d
    (7, 7, 7),
    (224, 224, (7, 7)),
    (9, 4, (None, 3)),
    (13, 13, 6),  # overlapping windows: the averaging matrices
    (2, 2, 7),  # more outputs than inputs
    (5, 9, (3, None)),
]


def _grad_fns(out: torch.Tensor) -> set[str]:
    """The names of every node of ``out``'s autograd graph."""
    names, seen, todo = set(), set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(fn.name())
        todo.extend(f for f, _ in fn.next_functions)
    return names


@pytest.mark.parametrize(("height", "width", "size"), SHAPES)
def test_values_and_gradients_are_adaptive_pooling(height: int, width: int, size) -> None:
    gen = torch.Generator().manual_seed(height * 31 + width)
    x = torch.randn(2, 3, height, width, generator=gen, requires_grad=True)
    ours, theirs = DeterministicAdaptiveAvgPool2d(size), nn.AdaptiveAvgPool2d(size)
    got, want = ours(x), theirs(x)
    out_h, out_w = size if isinstance(size, tuple) else (size, size)
    if height % (out_h or height) == 0 and width % (out_w or width) == 0:  # windows tile
        assert torch.equal(got, want)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    weights = torch.randn(want.shape, generator=gen)
    (g_ours,) = torch.autograd.grad((got * weights).sum(), x)
    (g_theirs,) = torch.autograd.grad((want * weights).sum(), x)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-6)
    assert not any("AdaptiveAvgPool" in name for name in _grad_fns(got))


def test_channels_last_and_bf16_keep_their_layout_and_dtype() -> None:
    x = torch.randn(2, 3, 13, 13).to(memory_format=torch.channels_last)
    assert torch.equal(DeterministicAdaptiveAvgPool2d(7)(x[..., :7, :7]), x[..., :7, :7])
    half = DeterministicAdaptiveAvgPool2d(6)(x.bfloat16())
    assert half.dtype == torch.bfloat16 and half.shape == (2, 3, 6, 6)


def test_torchvision_alexnet_loses_adaptive_pooling_but_not_weights() -> None:
    """AlexNet (6 x 6 pooling; VGG's 7 x 7 is the same module): the same state_dict keys
    as torchvision's, the same outputs, no adaptive-pooling node in the graph."""
    model = build_model("torchvision:alexnet", (3, 64, 64), 5).eval()
    assert type(model.avgpool) is DeterministicAdaptiveAvgPool2d
    assert not [m for m in model.modules() if type(m) is nn.AdaptiveAvgPool2d]
    plain = copy.deepcopy(model)
    plain.avgpool = nn.AdaptiveAvgPool2d(6)  # as torchvision builds it
    assert model.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(2, 3, 64, 64, requires_grad=True)
    out = model(x)
    torch.testing.assert_close(out, plain(x), rtol=0, atol=1e-5)
    assert not any("AdaptiveAvgPool" in name for name in _grad_fns(out))
    assert any("AdaptiveAvgPool" in name for name in _grad_fns(plain(x)))  # the check sees it


def test_pooling_to_one_pixel_is_left_alone() -> None:
    """A mean already (deterministic); a resnet stays torchvision's own module."""
    model = build_model("torchvision:resnet18", (3, 32, 32), 4)
    assert type(model.avgpool) is nn.AdaptiveAvgPool2d
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d((1, 1)), nn.AdaptiveAvgPool2d(2))
    deterministic_pooling(net)
    assert [type(m).__name__ for m in net] == [
        "Conv2d",
        "AdaptiveAvgPool2d",
        "DeterministicAdaptiveAvgPool2d",
    ]
