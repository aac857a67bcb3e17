"""The small models of the MNIST experiments: an MLP and LeNet-5."""

from __future__ import annotations

from torch import nn


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
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * feat * feat, 120),
        nn.ReLU(inplace=True),
        nn.Dropout(dropout),
        nn.Linear(120, 84),
        nn.ReLU(inplace=True),
        nn.Dropout(dropout),
        nn.Linear(84, num_classes),
    )
