"""What pretrained weights expect of their inputs, known before any network is built:
torchvision weights' normalisation and sizes (the data stage prepares the images with
them), and how a ``model.weights`` value names a local file or torchvision weights."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..runtime.errors import UserError

LOCAL_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")
HASH = re.compile(r"-([a-f0-9]{8,})\.")  # torchvision's file names end in a sha256 prefix


@dataclass(frozen=True)
class WeightsTransforms:
    """What torchvision's weights expect of their inputs."""

    mean: list[float]
    std: list[float]
    resize_size: int
    crop_size: int


def is_local(spec: str) -> bool:
    return spec.endswith(LOCAL_SUFFIXES) or "/" in spec


def torchvision_weights(spec: str) -> Any:
    """The ``WeightsEnum`` member named ``spec`` (``ResNet18_Weights.IMAGENET1K_V1``, or
    ``.DEFAULT``)."""
    import torchvision.models

    try:
        return torchvision.models.get_weight(spec)
    except (ValueError, KeyError, AttributeError):
        raise UserError(
            f"model.weights: {spec!r} is neither a local file ({', '.join(LOCAL_SUFFIXES)}) "
            "nor torchvision weights such as ResNet18_Weights.DEFAULT"
        ) from None


def transforms_of(spec: str | None) -> WeightsTransforms | None:
    """The normalisation and sizes of torchvision weights; None for a local file."""
    if spec is None or is_local(spec):
        return None
    t = torchvision_weights(spec).transforms()
    return WeightsTransforms(list(t.mean), list(t.std), t.resize_size[0], t.crop_size[0])
