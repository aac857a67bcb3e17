"""On-device augmentation of uint8 image batches: random crop with zero padding and
horizontal flip, as torchvision's ``RandomCrop(H, padding=p)`` then
``RandomHorizontalFlip()`` (the SWAG reference code's CIFAR transforms).

torchvision's transforms work one PIL image at a time in DataLoader
workers; here a whole batch is cropped and flipped with index arithmetic on
the device, from offsets drawn once per epoch for every image, so a resumed
run or any rank draws exactly the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Augment:
    crop_padding: int = 0  # pixels of zero padding on each side; 0 = no crop
    flip: bool = False  # random horizontal flip with probability 1/2

    @property
    def active(self) -> bool:
        return self.crop_padding > 0 or self.flip


@dataclass(frozen=True)
class EpochDraws:
    """Every image's crop offset (top, left in [0, 2 p]) and flip for one epoch."""

    top: torch.Tensor
    left: torch.Tensor
    flip: torch.Tensor

    def to(self, device: torch.device | str) -> EpochDraws:
        return EpochDraws(self.top.to(device), self.left.to(device), self.flip.to(device))

    def take(self, idx: torch.Tensor) -> EpochDraws:
        """The draws of a minibatch's images."""
        return EpochDraws(self.top[idx], self.left[idx], self.flip[idx])


def draw_epoch(n: int, augment: Augment, generator: torch.Generator) -> EpochDraws:
    """One epoch's offsets and flips for ``n`` images from the CPU ``generator``.

    Active: three draws of n values each (top, left, flip), whatever the flags,
    so the stream does not depend on them. Inactive: nothing is drawn.
    """
    if not augment.active:
        zeros = torch.zeros(n, dtype=torch.int64)
        return EpochDraws(zeros, zeros, torch.zeros(n, dtype=torch.bool))
    span = 2 * augment.crop_padding + 1
    top = torch.randint(0, span, (n,), generator=generator)
    left = torch.randint(0, span, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    if not augment.flip:
        flip = torch.zeros_like(flip)
    return EpochDraws(top, left, flip)


def apply(x: torch.Tensor, draws: EpochDraws, augment: Augment) -> torch.Tensor:
    """uint8 (B, C, H, W) -> each image cropped from its zero-padded copy at (top, left),
    then flipped where drawn; the input itself when ``augment`` is inactive."""
    if x.dtype != torch.uint8 or x.dim() != 4:
        raise ValueError(f"augment needs uint8 (B, C, H, W) images, got {x.dtype} {tuple(x.shape)}")
    if not augment.active:
        return x
    _, _, height, width = x.shape
    p = augment.crop_padding
    padded = torch.nn.functional.pad(x, (p, p, p, p)) if p else x
    rows = draws.top.view(-1, 1) + torch.arange(height, device=x.device).view(1, -1)
    cols = torch.arange(width, device=x.device).view(1, -1).expand(x.shape[0], -1)
    cols = torch.where(draws.flip.view(-1, 1), cols.flip(1), cols) + draws.left.view(-1, 1)
    batch = torch.arange(x.shape[0], device=x.device).view(-1, 1, 1)
    # (B, H, W, C) by advanced indexing on the padded (B, C, H', W') moved channels-last
    out = padded.permute(0, 2, 3, 1)[batch, rows.view(-1, height, 1), cols.view(-1, 1, width)]
    return out.permute(0, 3, 1, 2)
