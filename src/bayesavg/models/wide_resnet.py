"""WideResNet-28-10 as in the SWAG reference (wjmaddox/swa_gaussian, models/wide_resnet.py,
itself meliketoy/wide-resnet.pytorch).

Module names and construction order follow the reference, so its state dicts load and a
seed gives its initial bytes. Two reference details are kept on purpose: its
``conv_init`` is defined but never applied (PyTorch's default initialisation is what the
papers trained), and the final BatchNorm is built with ``momentum=0.9`` in PyTorch's
convention (running stats = 0.1 old + 0.9 batch), unlike the blocks' default 0.1. The
BN update after sampling (``bayesavg.training.batchnorm``) recomputes the statistics whatever
the momentum, so only the plain SGD model's running statistics see it.
"""

from __future__ import annotations

import torch
from torch import nn

from ..runtime.errors import UserError

FINAL_BN_MOMENTUM = 0.9  # the reference's nn.BatchNorm2d(..., momentum=0.9), PyTorch convention


class WideBasic(nn.Module):
    """Pre-activated 3x3 -> dropout -> 3x3 (strided) with biases; shortcut on the raw input."""

    def __init__(self, in_planes: int, planes: int, dropout: float, stride: int = 1) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, padding=1, bias=True)
        self.dropout = nn.Dropout(dropout)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=True)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.dropout(self.conv1(torch.relu(self.bn1(x))))
        out = self.conv2(torch.relu(self.bn2(out)))
        return out + self.shortcut(x)


class WideResNet(nn.Module):
    """WRN-depth-k (Zagoruyko & Komodakis 2016): depth = 6n+4, widths 16, 16k, 32k, 64k."""

    def __init__(
        self,
        in_shape: tuple[int, int, int],
        num_classes: int,
        depth: int = 28,
        widen_factor: int = 10,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise UserError(f"WideResNet depth must be 6n+4 with n >= 1, got {depth}")
        n = (depth - 4) // 6
        widths = (16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        self.in_planes = widths[0]
        self.conv1 = nn.Conv2d(in_shape[0], widths[0], 3, padding=1, bias=True)
        self.layer1 = self._wide_layer(widths[1], n, dropout, 1)
        self.layer2 = self._wide_layer(widths[2], n, dropout, 2)
        self.layer3 = self._wide_layer(widths[3], n, dropout, 2)
        self.bn1 = nn.BatchNorm2d(widths[3], momentum=FINAL_BN_MOMENTUM)
        self.linear = nn.Linear(widths[3], num_classes)

    def _wide_layer(self, planes: int, blocks: int, dropout: float, stride: int) -> nn.Sequential:
        layers: list[nn.Module] = []
        for s in [stride] + [1] * (blocks - 1):
            layers.append(WideBasic(self.in_planes, planes, dropout, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer3(self.layer2(self.layer1(self.conv1(x))))
        out = torch.relu(self.bn1(out))
        pooled = torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)
        return self.linear(pooled)


def wideresnet28x10(
    in_shape: tuple[int, int, int], num_classes: int, dropout: float = 0.0
) -> nn.Module:
    """WRN-28-10 of the SWAG paper; ``dropout`` is the in-block rate (0 there)."""
    return WideResNet(in_shape, num_classes, depth=28, widen_factor=10, dropout=dropout)
