"""On-device augmentation of uint8 image batches: random crop with zero padding and
horizontal flip, as torchvision's ``RandomCrop(H, padding=p)`` (constant fill 0)
then ``RandomHorizontalFlip()`` (the SWAG reference code's CIFAR transforms); or,
for networks pretrained on ImageNet, ``RandomResizedCrop(H)`` (scale 0.08-1,
aspect 3/4-4/3, bilinear, back to the training size) then the flip.

torchvision's transforms work one PIL image at a time in DataLoader
workers; here a whole batch is cropped and flipped with index arithmetic on
the device, from offsets drawn once per epoch for every image from a CPU
generator, so a resumed run or any rank draws exactly the same ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import ieee


@dataclass(frozen=True)
class Augment:
    """What to augment; the default (no crop, no flip) is inactive."""

    crop_padding: int = 0  # pixels of zero padding on each side; 0 = no crop
    flip: bool = False  # random horizontal flip with probability 1/2
    resized_crop: bool = False  # torchvision's RandomResizedCrop at the image's own size

    def __post_init__(self) -> None:
        if isinstance(self.crop_padding, bool) or not isinstance(self.crop_padding, int):
            raise ValueError(f"crop_padding must be an int, got {self.crop_padding!r}")
        if self.crop_padding < 0:
            raise ValueError(f"crop_padding must be >= 0, got {self.crop_padding}")
        if self.crop_padding and self.resized_crop:
            raise ValueError("crop_padding and resized_crop: one crop or the other")

    @property
    def active(self) -> bool:
        """Whether anything is drawn or changed; inactive runs are the unaugmented ones."""
        return self.crop_padding > 0 or self.flip or self.resized_crop


@dataclass(frozen=True)
class EpochDraws:
    """Every image's crop offset and flip for one epoch, indexed like the split."""

    top: torch.Tensor  # (n,) int64 in [0, 2 * crop_padding]
    left: torch.Tensor  # (n,) int64 in [0, 2 * crop_padding]
    flip: torch.Tensor  # (n,) bool
    # (n, ATTEMPTS, 4) uniforms in [0, 1) of a resized crop's tries: scale, log-ratio,
    # top, left (the box in pixels needs the image size: ``apply`` computes it)
    box: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.top.shape[0]

    def to(self, device: torch.device | str) -> EpochDraws:
        """Moved once per epoch, so the batches index them without host copies."""
        box = None if self.box is None else self.box.to(device)
        return EpochDraws(self.top.to(device), self.left.to(device), self.flip.to(device), box)

    def take(self, idx: torch.Tensor) -> EpochDraws:
        """The draws of a minibatch's images (``idx`` indexes the split)."""
        box = None if self.box is None else self.box[idx]
        return EpochDraws(self.top[idx], self.left[idx], self.flip[idx], box)


ATTEMPTS = 10  # torchvision's RandomResizedCrop.get_params tries
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def draw_epoch(n: int, augment: Augment, generator: torch.Generator) -> EpochDraws:
    """One epoch's offsets and flips for ``n`` images from the CPU ``generator``.

    Active: exactly ``randint(0, 2p + 1, (n,))`` for top, the same for left,
    then ``rand(n) < 0.5`` for flip, in that order, whatever ``crop_padding``
    and ``flip`` are (with ``flip`` False the flips are drawn, then zeroed), so
    the generator advances alike for every active setting. Inactive: nothing
    is drawn (the generator is untouched, so a run without augmentation is
    bitwise what it was before) and the draws are all zero / False.
    """
    if n < 0:
        raise ValueError(f"draw_epoch needs n >= 0 images, got {n}")
    if not augment.active:
        return EpochDraws(
            torch.zeros(n, dtype=torch.int64),
            torch.zeros(n, dtype=torch.int64),
            torch.zeros(n, dtype=torch.bool),
        )
    span = 2 * augment.crop_padding + 1
    top = torch.randint(0, span, (n,), generator=generator)
    left = torch.randint(0, span, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    if not augment.flip:
        flip = torch.zeros_like(flip)
    box = torch.rand(n, ATTEMPTS, 4, generator=generator) if augment.resized_crop else None
    return EpochDraws(top, left, flip, box)


def _boxes(box: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, 4) float crop boxes (top, left, h, w) in pixels from the tries' uniforms, as
    ``RandomResizedCrop.get_params``: the first try that fits, else the whole image
    clamped to the ratio range, centred. Vector ops only (no host sync)."""
    area = height * width
    scale = SCALE[0] + (SCALE[1] - SCALE[0]) * box[..., 0]
    lo, hi = math.log(RATIO[0]), math.log(RATIO[1])
    ratio = torch.exp(lo + (hi - lo) * box[..., 1])
    w = torch.round(ieee.sqrt(area * scale * ratio))
    h = torch.round(ieee.sqrt(area * scale / ratio))
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.argmax(fits.int(), dim=1, keepdim=True)  # the first True (0 if none)
    w, h = w.gather(1, first).squeeze(1), h.gather(1, first).squeeze(1)
    top = torch.floor(box[..., 2].gather(1, first).squeeze(1) * (height - h + 1))
    left = torch.floor(box[..., 3].gather(1, first).squeeze(1) * (width - w + 1))
    any_fit = fits.any(dim=1)
    in_ratio = width / height
    fh, fw = height, width  # torchvision's fallback: the central crop of a ratio in range
    if in_ratio < RATIO[0]:
        fh = round(width / RATIO[0])
    elif in_ratio > RATIO[1]:
        fw = round(height * RATIO[1])
    # column by column against Python numbers: a tensor of them would be a copy from
    # pageable host memory each batch, which on CUDA waits for the stream (a host sync)
    fallback = ((height - fh) // 2, (width - fw) // 2, fh, fw)
    found = (top, left, h, w)
    return torch.stack(
        [torch.where(any_fit, c, float(v)) for c, v in zip(found, fallback, strict=True)], dim=1
    )


def _resized_crop(x: torch.Tensor, draws: EpochDraws) -> torch.Tensor:
    """Each image's box resized (bilinear, half-pixel centres) to the full size, then
    flipped where drawn, by one ``grid_sample`` over the batch; uint8 out, rounded."""
    assert draws.box is not None
    batch, _, height, width = x.shape
    top, left, h, w = _boxes(draws.box.to(torch.float64), height, width).to(torch.float32).unbind(1)
    i = torch.arange(height, device=x.device, dtype=torch.float32) + 0.5
    j = torch.arange(width, device=x.device, dtype=torch.float32) + 0.5
    j = torch.where(draws.flip.view(-1, 1), j.flip(0), j)
    ys = (top.view(-1, 1) + i * (h.view(-1, 1) / height)) * (2 / height) - 1
    xs = (left.view(-1, 1) + j * (w.view(-1, 1) / width)) * (2 / width) - 1
    grid = torch.stack(
        [
            xs.view(batch, 1, width).expand(batch, height, width),
            ys.view(batch, height, 1).expand(batch, height, width),
        ],
        dim=-1,
    )
    out = torch.nn.functional.grid_sample(
        x.float(), grid, mode="bilinear", padding_mode="border", align_corners=False
    )
    return out.round_().clamp_(0, 255).to(torch.uint8)


def apply(x: torch.Tensor, draws: EpochDraws, augment: Augment) -> torch.Tensor:
    """uint8 (B, C, H, W) -> each image cropped (H x W) at (top, left) from its copy
    zero-padded by ``crop_padding``, then flipped left-right where drawn; the input
    itself when ``augment`` is inactive.

    One gather for the whole batch on ``x``'s device (draws elsewhere are moved
    there); the output is channels-last when ``x`` is, contiguous otherwise, so
    the layout a caller chose survives. Offsets must lie in [0, 2 * crop_padding]
    (as ``draw_epoch`` gives); they are not checked, as that would sync the host.
    """
    if x.dtype != torch.uint8 or x.dim() != 4:
        raise ValueError(
            f"augment needs uint8 (B, C, H, W) images, got {x.dtype} of shape {tuple(x.shape)}"
        )
    if not augment.active:
        return x
    batch, channels, height, width = x.shape
    if not (len(draws) == draws.left.shape[0] == draws.flip.shape[0] == batch):
        raise ValueError(
            f"augment got {batch} images but draws for {tuple(draws.top.shape)}, "
            f"{tuple(draws.left.shape)}, {tuple(draws.flip.shape)}; take() the batch's rows"
        )
    draws = draws.to(x.device)  # a no-op when the caller already moved them
    if augment.resized_crop:
        return _resized_crop(x, draws)
    p = augment.crop_padding
    padded = torch.nn.functional.pad(x, (p, p, p, p)) if p else x
    # source row / column of every output pixel in the padded image: (B, H) and (B, W)
    rows = draws.top.view(-1, 1) + torch.arange(height, device=x.device)
    cols = torch.arange(width, device=x.device).expand(batch, width)
    cols = torch.where(draws.flip.view(-1, 1), cols.flip(1), cols) + draws.left.view(-1, 1)
    b = torch.arange(batch, device=x.device).view(-1, 1, 1)
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        # gather (B, H, W, C) from the channels-last view: the result is channels-last
        out = padded.permute(0, 2, 3, 1)[b, rows.view(-1, height, 1), cols.view(-1, 1, width)]
        return out.permute(0, 3, 1, 2)
    c = torch.arange(channels, device=x.device).view(1, -1, 1, 1)
    return padded[b.view(-1, 1, 1, 1), c, rows.view(-1, 1, height, 1), cols.view(-1, 1, 1, width)]
