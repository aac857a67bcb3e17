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

import warnings

import pytest
import torch
from cuda_determinism import REFUSED, Recorder, documented_entries
from torch import nn

from bayesavg.models import build_model
from bayesavg.models.external import torchvision_builders

BUILT_IN = [
    ("mlp", (1, 28, 28), {"hidden": [16], "batch_norm": True}),
    ("lenet5", (1, 28, 28), {}),
    ("vgg16_bn", (3, 32, 32), {}),
    ("preresnet20", (3, 32, 32), {}),
    ("preresnet", (3, 32, 32), {"depth": 56}),
    ("wideresnet28x10", (3, 32, 32), {}),
]
# One builder per family of torchvision.models' classifiers (the slow test takes all).
FAMILIES = [
    "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s",
    "googlenet", "inception_v3", "maxvit_t", "mnasnet0_5", "mobilenet_v2",
    "mobilenet_v3_small", "regnet_y_400mf", "resnet18", "resnext50_32x4d",
    "shufflenet_v2_x0_5", "squeezenet1_1", "swin_t", "swin_v2_t", "vgg11_bn", "vit_b_16",
    "wide_resnet50_2",
]  # fmt: skip
# Where a builder's sizes are fixed (ViT's patch grid, MaxViT's windows) or its network
# cannot be built on the meta device (RegNet computes its widths from tensors' values).
SIZE = {"vit": 224, "maxvit": 224, "swin": 224, "inception": 96}
ON_CPU = ("regnet",)


def _step(model: nn.Module, x: torch.Tensor, classes: int) -> list[tuple[str, str]]:
    """What a training step and a prediction call that CUDA refuses, with the output checks
    the training loop relies on: one tensor of ``classes`` logits per image."""
    y = torch.arange(len(x), device=x.device) % classes
    with Recorder() as recorder:
        model.train()
        logits = model(x)
        assert isinstance(logits, torch.Tensor), type(logits).__name__
        assert logits.shape == (len(x), classes)
        nn.functional.cross_entropy(logits, y).backward()
        model.eval()
        with torch.no_grad():
            model(x)
    return recorder.calls


def _torchvision_step(builder: str) -> list[tuple[str, str]]:
    size = next((s for prefix, s in SIZE.items() if builder.startswith(prefix)), 64)
    device = "cpu" if builder.startswith(ON_CPU) else "meta"
    with warnings.catch_warnings(), torch.device(device):
        warnings.simplefilter("ignore")  # torchvision's notes on initialisation defaults
        model = build_model(f"torchvision:{builder}", (3, size, size), 5)
        x = torch.randn(2, 3, size, size)
    return _step(model, x, 5)


def test_every_refused_operation_of_torch_is_mapped() -> None:
    """torch's list and ours name the same entries: a new torch's additions fail here."""
    documented = documented_entries()
    assert len(documented) > 15
    assert set(documented) == set(REFUSED)


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
    with torch.device("meta"):
        model = build_model(name, shape, 10, kwargs)
        x = torch.randn(4, *shape)
    assert _step(model, x, 10) == []


@pytest.mark.parametrize("builder", FAMILIES)
def test_torchvision_families_train_without_refused_operators(builder: str) -> None:
    assert builder in torchvision_builders()
    assert _torchvision_step(builder) == []


@pytest.mark.slow  # every classifier torchvision has (about 80): a minute on 2 cores
def test_every_torchvision_classifier_trains_without_refused_operators() -> None:
    failed = {b: calls for b in torchvision_builders() if (calls := _torchvision_step(b))}
    assert failed == {}
