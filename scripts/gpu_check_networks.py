"""The ``networks`` part of ``scripts/gpu_check.py``: every built-in network and one
classifier of each torchvision family through two training steps and a prediction on the
device, with deterministic algorithms on, as every CUDA stage has them
(``seed_everything``). On the CPU, ``tests/test_cuda_determinism.py`` records the same
steps for the operators CUDA refuses in that mode; this is the GPU's own word on it. The
lists are shared with that test."""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch
from gpu_check_runner import Context
from torch import nn

from bayesavg.models import build_model
from bayesavg.seeding import seed_everything
from bayesavg.training import optim

# (name, input shape, kwargs) of the registry's networks
BUILT_IN: list[tuple[str, tuple[int, int, int], dict[str, Any]]] = [
    ("mlp", (1, 28, 28), {"hidden": [16], "batch_norm": True}),
    ("lenet5", (1, 28, 28), {}),
    ("vgg16_bn", (3, 32, 32), {}),
    ("preresnet20", (3, 32, 32), {}),
    ("preresnet", (3, 32, 32), {"depth": 56}),
    ("wideresnet28x10", (3, 32, 32), {}),
]
# One builder per family of torchvision.models' classifiers.
FAMILIES = [
    "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s",
    "googlenet", "inception_v3", "maxvit_t", "mnasnet0_5", "mobilenet_v2",
    "mobilenet_v3_small", "regnet_y_400mf", "resnet18", "resnext50_32x4d",
    "shufflenet_v2_x0_5", "squeezenet1_1", "swin_t", "swin_v2_t", "vgg11_bn", "vit_b_16",
    "wide_resnet50_2",
]  # fmt: skip
# Image sizes where a builder's are fixed (ViT's patch grid, MaxViT's and Swin's windows)
# or 64 x 64 would be too small (Inception's stem); every other builder takes 64.
SIZES = {"vit": 224, "maxvit": 224, "swin": 224, "inception": 96}
CLASSES = 5
# RegNet computes its widths from tensors' values: it cannot be built on the meta device.
NOT_ON_META = ("torchvision:regnet",)


def torchvision_shape(builder: str) -> tuple[int, int, int]:
    size = next((s for prefix, s in SIZES.items() if builder.startswith(prefix)), 64)
    return (3, size, size)


def every_network() -> list[tuple[str, tuple[int, int, int], dict[str, Any]]]:
    """The built-in networks, then the torchvision families, as ``build_model`` takes them."""
    tv = [(f"torchvision:{b}", torchvision_shape(b), {}) for b in FAMILIES]
    return BUILT_IN + tv


def build(name: str, shape: tuple[int, int, int], kwargs: dict[str, Any]) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchvision's notes on initialisation defaults
        return build_model(name, shape, CLASSES, kwargs)


def step(model: nn.Module, x: torch.Tensor, steps: int = 2) -> None:
    """Two training steps (forward, loss, backward, the library's SGD with momentum and
    weight decay: on CUDA its fused kernel over every parameter, whatever their layouts;
    the second step with momentum buffers), then a prediction; the output checks the
    training loop relies on: one tensor of ``CLASSES`` logits per image. ``steps``: one
    where only shapes are checked (``--quick``, the meta device, whose BatchNorm runs as
    Python decompositions: 0.3 s a step for most networks, 25 s for all 27 at two)."""
    y = torch.arange(len(x), device=x.device) % CLASSES
    opt = optim.build("sgd", model.parameters(), momentum=0.9, weight_decay=5e-4)
    opt.param_groups[0]["lr"] = 0.01
    model.train()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        if not isinstance(logits, torch.Tensor) or logits.shape != (len(x), CLASSES):
            raise TypeError(f"the training-mode output is {type(logits).__name__}, not logits")
        nn.functional.cross_entropy(logits, y).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        model(x)


def device_for(name: str, device: torch.device, shapes_only: bool) -> torch.device:
    """``shapes_only`` (``--quick``, a smoke run of this part on the CPU, and the CPU
    recorder's test): the meta device, where the network can be built there."""
    if not shapes_only or name.startswith(NOT_ON_META):
        return device
    return torch.device("meta")


def networks(ctx: Context) -> dict[str, Any]:
    """Each network built on the device and stepped; its time or its error's first line."""
    device = torch.device(ctx.device)
    seed_everything(0, device)  # deterministic algorithms on CUDA, as every stage
    found: dict[str, dict[str, Any]] = {}
    for name, shape, kwargs in every_network():
        started, model = time.perf_counter(), None
        try:
            with torch.device(device_for(name, device, ctx.quick)):
                model = build(name, shape, kwargs)
                x = torch.randn(2, *shape)
            step(model, x, 1 if ctx.quick else 2)
            if device.type == "cuda":
                torch.cuda.synchronize()
            found[name] = {"ok": True, "seconds": round(time.perf_counter() - started, 2)}
        except Exception as err:  # the finding: which network, and torch's own words
            found[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
        del model  # its memory back before the next network
        ctx.report({"networks": found})
    out: dict[str, Any] = {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "networks": found,
    }
    failed = sorted(n for n, r in found.items() if "error" in r)
    if failed:
        out["error"] = f"{len(failed)} of {len(found)} networks failed: {', '.join(failed)}"
    return out
