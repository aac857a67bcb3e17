"""An example factory: ``model.factory: networks.example:small_cnn``."""

from __future__ import annotations

from torch import nn


def small_cnn(
    input_shape: tuple[int, int, int], num_classes: int, width: int = 32, dropout: float = 0.0
) -> nn.Module:
    """Two convolution blocks with BatchNorm, global average pooling, dropout, a linear
    head: the shape of network every method here handles (BN recomputation, MC dropout,
    a last-layer Laplace on the head)."""
    channels = input_shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1, bias=False),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(2 * width, num_classes),
    )
