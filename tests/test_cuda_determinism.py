"""No network this pipeline trains calls an operator a deterministic CUDA run refuses.

CUDA runs here use deterministic algorithms (``seeding.deterministic_kernels``), and an
operator without a deterministic CUDA kernel stops them at its first call, on the GPU
only. ``cuda_determinism.Recorder`` finds such calls on the CPU (see its module). Here:
the recorder itself, against torch's own list; and every built-in network and every
family of torchvision's classifiers through a training step (train-mode forward, the
loss, backward) and an eval-mode forward, on the meta device where the network can be
built there (shapes only: seconds for a ViT-H). The default suite takes one builder per
torchvision family, ``make test-slow`` all of them. The pipeline's own code around the
networks (posteriors, evaluation, Laplace, landscape) is recorded in the traced
end-to-end run (tests/test_pipeline.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from cuda_determinism import REFUSED, Recorder, documented_entries
from torch import nn

from bayesavg.models.external import torchvision_builders
from bayesavg.runtime.torch_version import older

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
# The networks, shared with gpu-check's ``networks`` part (the same steps on a GPU).
from gpu_check_networks import (
    BUILT_IN,
    FAMILIES,
    build,
    device_for,
    step,
    torchvision_shape,
)


def _recorded(name: str, shape: tuple[int, int, int], kwargs: dict) -> list[tuple[str, str]]:
    """The refused calls of gpu-check's step (a training step and a prediction, with its
    output checks) on ``name``, built on the meta device where it can be."""
    with torch.device(device_for(name, torch.device("cpu"), shapes_only=True)):
        model = build(name, shape, kwargs)
        x = torch.randn(2, *shape)
    with Recorder() as recorder:
        step(model, x)
    return recorder.calls


# Listed as raising by the docstring of torch before 2.14 (the GPU image's 2.11), as
# deterministic by 2.14.1's. cumsum is not refused on 2.11 either: the default pipeline's
# evaluation (cumsum in selective prediction and OOD) ran on the H200 with deterministic
# algorithms. No network here has a MaxPool3d.
_LISTED_BEFORE_2_14 = {"torch.cumsum", "torch.nn.MaxPool3d"}


def test_every_refused_operation_of_torch_is_mapped() -> None:
    """torch's list and ours name the same entries: a new torch's additions fail here."""
    documented = set(documented_entries())
    assert len(documented) > 15
    if older(torch.__version__, "2.14"):
        documented -= _LISTED_BEFORE_2_14
    assert documented == set(REFUSED)


def test_the_recorder_finds_each_kind_of_refused_call() -> None:
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    cases = {
        "_adaptive_avg_pool2d_backward": lambda: nn.AdaptiveAvgPool2d(4)(x).sum().backward(),
        "upsample_bilinear2d_backward": lambda: (
            nn.functional.interpolate(x, scale_factor=2, mode="bilinear").sum().backward()
        ),
        "reflection_pad2d_backward": lambda: nn.ReflectionPad2d(1)(x).sum().backward(),
        "nll_loss2d_forward": lambda: nn.functional.cross_entropy(
            x, torch.zeros(2, 9, 9, dtype=torch.long)
        ),
        "histc": lambda: torch.histc(x.detach(), bins=4),
        "bincount": lambda: torch.bincount(torch.tensor([0, 1, 1]), torch.ones(3)),
        "median.dim": lambda: x.detach().median(dim=1),
        "scatter_reduce.two": lambda: torch.zeros(3).scatter_reduce(
            0, torch.tensor([0, 1, 1]), torch.ones(3), reduce="prod"
        ),
        "put_": lambda: torch.zeros(3).put_(torch.tensor([1]), torch.ones(1)),
    }
    for name, call in cases.items():
        with Recorder(roots=(__file__,)) as recorder:
            call()
        assert [op for op, _ in recorder.calls] == [name], name
        assert recorder.calls[0][1].startswith(__file__), recorder.calls
    allowed = [  # their CUDA kernels are deterministic, or deterministic in this mode
        lambda: nn.MaxPool2d(2)(x).sum().backward(),
        lambda: nn.AdaptiveAvgPool2d(1)(x).sum().backward(),  # a mean
        lambda: nn.functional.cross_entropy(x.mean((2, 3)), torch.tensor([0, 1])).backward(),
        lambda: torch.bincount(torch.tensor([0, 1, 1])),
        lambda: x.detach().median(),
        lambda: torch.zeros(3).scatter_reduce(
            0, torch.tensor([0, 1, 1]), torch.ones(3), reduce="sum"
        ),
        lambda: torch.zeros(3).index_add_(0, torch.tensor([0, 1, 1]), torch.ones(3)),
        lambda: x.detach().cumsum(0),
    ]
    for call in allowed:
        with Recorder() as recorder:
            call()
        assert recorder.calls == []


@pytest.mark.parametrize(("name", "shape", "kwargs"), BUILT_IN, ids=[b[0] for b in BUILT_IN])
def test_built_in_networks_train_without_refused_operators(name: str, shape, kwargs) -> None:
    assert _recorded(name, shape, kwargs) == []


@pytest.mark.parametrize("builder", FAMILIES)
def test_torchvision_families_train_without_refused_operators(builder: str) -> None:
    assert builder in torchvision_builders()
    assert _recorded(f"torchvision:{builder}", torchvision_shape(builder), {}) == []


@pytest.mark.slow  # every classifier torchvision has (about 80): a minute on 2 cores
def test_every_torchvision_classifier_trains_without_refused_operators() -> None:
    failed = {
        b: calls
        for b in torchvision_builders()
        if (calls := _recorded(f"torchvision:{b}", torchvision_shape(b), {}))
    }
    assert failed == {}
