"""Pre-activation ResNets for CIFAR (He et al. 2016).

``preresnet`` follows the SWAG reference (wjmaddox/swa_gaussian, models/preresnet.py,
itself bearpaw/pytorch-classification): same blocks, module names (a reference state
dict loads), construction order and initialisation, so a seed gives the reference's
bytes. ``preresnet20`` is this project's earlier network and stays bit-for-bit as it
was (PyTorch default initialisation, shortcut on the pre-activated input), because
trained posterior files and tests depend on it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..runtime.errors import UserError

DEPTH_RULE = "6n+2 below 44 (basic blocks) or 9n+2 from 44 on (bottlenecks), e.g. 20, 56, 110, 164"


def preresnet_blocks(depth: int) -> tuple[bool, int]:
    """(bottleneck?, blocks per stage) for a reference PreResNet depth; UserError if invalid."""
    bottleneck = depth >= 44
    step = 9 if bottleneck else 6
    if depth < 8 or (depth - 2) % step:
        raise UserError(f"preresnet depth must be {DEPTH_RULE}; got {depth}")
    return bottleneck, (depth - 2) // step


class BasicBlock(nn.Module):
    """Two pre-activated 3x3 convolutions; the projection shortcut sees the raw input."""

    expansion = 1

    def __init__(
        self, in_planes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(torch.relu(self.bn1(x)))
        out = self.conv2(torch.relu(self.bn2(out)))
        return out + (self.downsample(x) if self.downsample is not None else x)


class Bottleneck(nn.Module):
    """Pre-activated 1x1 -> 3x3 (strided) -> 1x1 x4 convolutions, as in the reference."""

    expansion = 4

    def __init__(
        self, in_planes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(torch.relu(self.bn1(x)))
        out = self.conv2(torch.relu(self.bn2(out)))
        out = self.conv3(torch.relu(self.bn3(out)))
        return out + (self.downsample(x) if self.downsample is not None else x)


class PreResNet(nn.Module):
    """The SWAG reference PreResNet (PreResNet-56/110/164 in the papers); dropout before fc.

    Convolutions are drawn from N(0, 2 / (k*k*out_channels)) after construction, as in
    the reference; BatchNorm starts at weight 1, bias 0; fc keeps PyTorch's default.
    """

    def __init__(
        self,
        in_shape: tuple[int, int, int],
        num_classes: int,
        depth: int = 20,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        bottleneck, n = preresnet_blocks(depth)
        block: type[BasicBlock | Bottleneck] = Bottleneck if bottleneck else BasicBlock
        self.in_planes = 16
        self.conv1 = nn.Conv2d(in_shape[0], 16, 3, padding=1, bias=False)
        self.layer1 = self._make_layer(block, 16, n, 1)
        self.layer2 = self._make_layer(block, 32, n, 2)
        self.layer3 = self._make_layer(block, 64, n, 2)
        self.bn = nn.BatchNorm2d(64 * block.expansion)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(64 * block.expansion, num_classes)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                    m.weight.normal_(0.0, math.sqrt(2.0 / fan_out))
                elif isinstance(m, nn.BatchNorm2d):
                    m.weight.fill_(1.0)
                    m.bias.zero_()

    def _make_layer(
        self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int, stride: int
    ) -> nn.Sequential:
        # The shortcut is built before its block, as in the reference (same random draws).
        downsample = None
        if stride != 1 or self.in_planes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.in_planes, planes * block.expansion, 1, stride=stride, bias=False)
            )
        layers: list[nn.Module] = [block(self.in_planes, planes, stride, downsample)]
        self.in_planes = planes * block.expansion
        layers += [block(self.in_planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer3(self.layer2(self.layer1(self.conv1(x))))
        out = torch.relu(self.bn(out))
        pooled = torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)
        return self.fc(self.drop(pooled))


def preresnet(
    in_shape: tuple[int, int, int], num_classes: int, depth: int = 20, dropout: float = 0.0
) -> nn.Module:
    """Reference PreResNet of any valid ``depth`` (SWAG: 56, 110, 164)."""
    return PreResNet(in_shape, num_classes, depth=depth, dropout=dropout)


class _PreActBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.shortcut: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(x))
        identity = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        out = self.conv2(torch.relu(self.bn2(out)))
        return out + identity


class PreResNet20(nn.Module):
    """This project's original PreResNet-20 (``preresnet20``), kept unchanged for its files.

    Differs from ``PreResNet(depth=20)``: PyTorch's default initialisation, and the
    projection shortcut takes the pre-activated input.
    """

    def __init__(
        self,
        in_shape: tuple[int, int, int],
        num_classes: int,
        depth: int = 20,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise UserError(f"PreResNet depth must be 6n+2, got {depth}")
        n = (depth - 2) // 6
        self.conv = nn.Conv2d(in_shape[0], 16, 3, padding=1, bias=False)
        blocks: list[nn.Module] = []
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                blocks.append(_PreActBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(in_planes)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(self.conv(x))
        out = torch.relu(self.bn(out))
        pooled = torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)
        return self.fc(self.drop(pooled))


def preresnet20(
    in_shape: tuple[int, int, int], num_classes: int, dropout: float = 0.0
) -> nn.Module:
    """The original ``preresnet20`` (see ``PreResNet20``)."""
    return PreResNet20(in_shape, num_classes, depth=20, dropout=dropout)
