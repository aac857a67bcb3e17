"""The small models of the MNIST experiments: an MLP and LeNet-5."""

from __future__ import annotations

import torch
from torch import nn


class MaxPool2x2(nn.MaxPool2d):
    """``nn.MaxPool2d(2)`` whose forward without autograd, on the CPU, is the maximum of
    the four strided views of each 2x2 window.

    Why by hand: torch's CPU kernel for contiguous inputs is about 12x slower (8.8 ms
    against 0.7 ms for LeNet-5's first pooling of 1,000 images here), slower than the
    convolution before it; LeNet-5's predictions spent about 45% of their time in it.
    The values are the same maxima (NaN wins in both; only which of a -0.0 and a +0.0
    tied for the maximum is kept could differ, and LeNet-5's biased convolutions give
    no exact -0.0). With autograd (training, sharpness), on other devices and for odd
    sizes it is ``nn.MaxPool2d`` itself, whose gradient goes to the first maximum.
    """

    def __init__(self) -> None:
        super().__init__(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plain = x.device.type != "cpu" or x.dim() != 4 or x.shape[-1] % 2 or x.shape[-2] % 2
        if plain or (torch.is_grad_enabled() and x.requires_grad):
            return super().forward(x)
        top = torch.maximum(x[..., 0::2, 0::2], x[..., 0::2, 1::2])
        bottom = torch.maximum(x[..., 1::2, 0::2], x[..., 1::2, 1::2])
        return torch.maximum(top, bottom)


def mlp(
    in_shape: tuple[int, int, int],
    num_classes: int,
    hidden: tuple[int, ...] = (512, 256),
    dropout: float = 0.0,
    batch_norm: bool = False,
) -> nn.Module:
    """Fully connected ReLU network on flattened images; dropout after each hidden layer.

    ``batch_norm`` adds BatchNorm after each hidden linear layer: the smallest
    model that exercises the BatchNorm paths (BN update after sampling, ALGORITHMS §6).
    """
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_shape[0] * in_shape[1] * in_shape[2]
    for h in hidden:
        layers.append(nn.Linear(width, h))
        if batch_norm:
            layers.append(nn.BatchNorm1d(h))
        layers += [nn.ReLU(inplace=True), nn.Dropout(dropout)]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def lenet5(in_shape: tuple[int, int, int], num_classes: int, dropout: float = 0.0) -> nn.Module:
    """LeNet-5 (ReLU, max pooling); 28x28 inputs are padded to 32x32 as in the original.

    Dropout sits after the two hidden fully connected layers, as in MC-dropout LeNets.
    """
    channels, height, width = in_shape
    pad = 2 if (height, width) == (28, 28) else 0
    feat = ((height + 2 * pad - 4) // 2 - 4) // 2
    return nn.Sequential(
        nn.Conv2d(channels, 6, 5, padding=pad),
        nn.ReLU(inplace=True),
        MaxPool2x2(),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(inplace=True),
        MaxPool2x2(),
        nn.Flatten(),
        nn.Linear(16 * feat * feat, 120),
        nn.ReLU(inplace=True),
        nn.Dropout(dropout),
        nn.Linear(120, 84),
        nn.ReLU(inplace=True),
        nn.Dropout(dropout),
        nn.Linear(84, num_classes),
    )
