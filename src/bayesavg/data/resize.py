"""Images at a network's input size: the shorter side resized (bilinear, antialiased),
then the centre cropped square, as torchvision's pretrained weights' eval transforms
(``Resize(resize_size)``, ``CenterCrop(crop_size)``) do, on uint8 tensors."""

from __future__ import annotations

import torch

CHUNK = 256  # images resized at once: bounded float memory for large splits
DEFAULT_RATIO = 256 / 224  # torchvision's classic Resize(256) + CenterCrop(224)


def resize_size_for(image_size: int, ratio: float | None = None) -> int:
    """The shorter side before the crop: ``image_size`` times the weights' resize/crop
    ratio (torchvision's 256/224 where none is given)."""
    return round(image_size * (DEFAULT_RATIO if ratio is None else ratio))


def resize_crop(x: torch.Tensor, resize_size: int, image_size: int) -> torch.Tensor:
    """uint8 (N, C, H, W) -> uint8 (N, C, image_size, image_size)."""
    from torchvision.transforms.v2 import functional as F

    if x.shape[-2:] == (image_size, image_size) and min(x.shape[-2:]) == resize_size:
        return x
    parts = []
    for start in range(0, x.shape[0], CHUNK):
        chunk = F.resize(x[start : start + CHUNK], [resize_size], antialias=True)
        parts.append(F.center_crop(chunk, [image_size, image_size]))
    return torch.cat(parts).contiguous()
