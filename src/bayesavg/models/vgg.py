"""VGG16 for CIFAR with the SWA/SWAG papers' classifier (512-512-C, dropout before each
hidden linear layer) in place of torchvision's ImageNet one (4096-wide, 7x7 pooling)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..runtime.errors import UserError

VGG16_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
)  # fmt: skip


def _classifier_width(name: str, in_shape: tuple[int, int, int]) -> int:
    """Flattened feature width after five 2x2 poolings (512 on 32x32 CIFAR images)."""
    _, height, width = in_shape
    if height % 32 or width % 32:
        raise UserError(f"{name} needs image sides divisible by 32, got {height}x{width}")
    return 512 * (height // 32) * (width // 32)


def vgg16_bn(in_shape: tuple[int, int, int], num_classes: int, dropout: float = 0.5) -> nn.Module:
    """VGG16 with BatchNorm, CIFAR classifier (512-512-C with dropout 0.5) as in SWAG."""
    from torchvision.models.vgg import cfgs as vgg_cfgs  # imported here: it costs ~2 s
    from torchvision.models.vgg import make_layers

    channels = in_shape[0]
    feat = _classifier_width("vgg16_bn", in_shape)
    features = make_layers(vgg_cfgs["D"], batch_norm=True)
    if channels != 3:
        features[0] = nn.Conv2d(channels, 64, kernel_size=3, padding=1)
    classifier = nn.Sequential(nn.Flatten(), *_head(feat, num_classes, dropout))
    return nn.Sequential(features, classifier)


def _head(feat: int, num_classes: int, dropout: float) -> list[nn.Module]:
    """The SWAG papers' CIFAR classifier: dropout, 512, dropout, 512, classes."""
    return [
        nn.Dropout(dropout),
        nn.Linear(feat, 512),
        nn.ReLU(inplace=True),
        nn.Dropout(dropout),
        nn.Linear(512, 512),
        nn.ReLU(inplace=True),
        nn.Linear(512, num_classes),
    ]


class VGG16(nn.Module):
    """The SWAG paper's VGG16 without BatchNorm (reference models/vgg.py, ``VGG16``).

    Module names and construction order follow the reference, so its state dicts load and
    a seed gives its bytes: convolutions N(0, 2 / (k*k*out_channels)) with zero biases
    (without BN, PyTorch's default init shrinks the signal layer by layer), linear layers
    PyTorch's default.
    """

    def __init__(
        self, in_shape: tuple[int, int, int], num_classes: int, dropout: float = 0.5
    ) -> None:
        super().__init__()
        feat = _classifier_width("vgg16", in_shape)
        layers: list[nn.Module] = []
        channels = in_shape[0]
        for v in VGG16_CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                assert isinstance(v, int)
                layers += [nn.Conv2d(channels, v, 3, padding=1), nn.ReLU(inplace=True)]
                channels = v
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(*_head(feat, num_classes, dropout))
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                    m.weight.normal_(0.0, math.sqrt(2.0 / fan_out))
                    m.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def vgg16(in_shape: tuple[int, int, int], num_classes: int, dropout: float = 0.5) -> nn.Module:
    """VGG16 without BatchNorm, as in the SWAG paper (see ``VGG16``)."""
    return VGG16(in_shape, num_classes, dropout=dropout)
