"""Adaptive average pooling that CUDA can differentiate deterministically.

A CUDA run with ``deterministic: true`` (the default) uses deterministic kernels
(``seeding.deterministic_kernels``), and
``adaptive_avg_pool2d``'s CUDA backward has none: it scatters with atomics, so torch
raises "adaptive_avg_pool2d_backward_cuda does not have a deterministic implementation"
at the first backward of torchvision's VGG (7 x 7 pooling) and AlexNet (6 x 6). Pooling
to 1 x 1 is a mean in torch (deterministic) and is left alone. ``DeterministicAdaptiveAvgPool2d``
computes the same windows (torch's: rows floor(i H / h) to ceil((i + 1) H / h)) with
operations whose backward is deterministic: ``avg_pool2d`` where the windows tile the
input (bitwise torch's result on the CPU, tested), else two small averaging matrices.
It holds no parameters or buffers, so a network's ``state_dict`` and pretrained weights
are unchanged.
"""

from __future__ import annotations

import torch
from torch import nn


def _pair(size: int | tuple[int | None, int | None] | None) -> tuple[int | None, int | None]:
    return (size, size) if not isinstance(size, tuple) else size


def _windows(size: int, out: int, like: torch.Tensor) -> torch.Tensor:
    """(out, size) averaging matrix: row i is 1/len over torch's window i, 0 elsewhere;
    built on ``like``'s device and dtype (no host-to-device copy)."""
    i = torch.arange(out, device=like.device)
    start = torch.div(i * size, out, rounding_mode="floor")
    end = torch.div((i + 1) * size + out - 1, out, rounding_mode="floor")
    j = torch.arange(size, device=like.device)
    inside = (j >= start[:, None]) & (j < end[:, None])
    return inside.to(like.dtype) / (end - start)[:, None].to(like.dtype)


class DeterministicAdaptiveAvgPool2d(nn.Module):
    """``nn.AdaptiveAvgPool2d(output_size)`` with a deterministic backward on CUDA."""

    def __init__(self, output_size: int | tuple[int | None, int | None] | None) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        oh, ow = _pair(self.output_size)
        oh, ow = oh or height, ow or width
        if height % oh == 0 and width % ow == 0:
            return nn.functional.avg_pool2d(x, (height // oh, width // ow))
        rows, cols = _windows(height, oh, x), _windows(width, ow, x)
        return torch.einsum("ih,...hw,jw->...ij", rows, x, cols)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


def deterministic_pooling(model: nn.Module) -> nn.Module:
    """``model`` with each ``nn.AdaptiveAvgPool2d`` not pooling to 1 x 1 replaced (in place)."""
    for name, module in list(model.named_modules()):
        if type(module) is nn.AdaptiveAvgPool2d and _pair(module.output_size) != (1, 1):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, DeterministicAdaptiveAvgPool2d(module.output_size))
    return model
