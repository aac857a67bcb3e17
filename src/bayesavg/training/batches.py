"""The training split on the device and how an epoch cuts it into batches.

The loop (``train``) takes either kind of split and asks it for a batch by index:
``Tensors`` holds pre-normalised rows, ``TrainData`` keeps uint8 images and
normalises (and augments) each batch. How many batches an epoch has, and which
share of each a rank takes, are decided here, once for every trajectory kind.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..runtime.errors import UserError
from .augment import Augment, EpochDraws, apply
from .distributed import World


@dataclass(frozen=True)
class Tensors:
    """Model-ready inputs (float, normalised) and labels, already on the device."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[0]

    def batch(
        self, idx: torch.Tensor, draws: EpochDraws | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.y[idx]


@dataclass(frozen=True)
class TrainData:
    """The training split on the device as uint8, normalised (and augmented) per batch.

    Normalising a batch applies the same elementwise operations as
    ``data.prepared.to_input`` does to the whole split, so without augmentation a
    batch is bitwise the pre-normalised one, at a quarter of the memory.
    """

    x: torch.Tensor
    y: torch.Tensor
    mean: Sequence[float]
    std: Sequence[float]
    augment: Augment = field(default_factory=Augment)
    channels_last: bool = False
    # The constants on the images' device, built once: per batch they would cost two
    # host-to-device copies, each a synchronisation, every step.
    _m: torch.Tensor = field(init=False, repr=False, compare=False)
    _s: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, values in (("_m", self.mean), ("_s", self.std)):
            constant = torch.tensor(values, dtype=torch.float32, device=self.x.device)
            object.__setattr__(self, name, constant.view(1, -1, 1, 1))

    def __len__(self) -> int:
        return self.x.shape[0]

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(dtype=torch.float32).div_(255)
        xf = xf.sub_(self._m).div_(self._s)
        layout = torch.channels_last if self.channels_last else torch.contiguous_format
        return xf.contiguous(memory_format=layout)

    def batch(
        self, idx: torch.Tensor, draws: EpochDraws | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[idx]
        if draws is not None:
            x = apply(x, draws.take(idx), self.augment)
        return self._normalise(x), self.y[idx]

    def inputs(self, batch_size: int = 4096) -> torch.Tensor:
        """The whole split normalised, not augmented (BatchNorm recomputation, monitoring)."""
        return torch.cat(
            [self._normalise(self.x[i : i + batch_size]) for i in range(0, len(self), batch_size)]
        )


def batches_per_epoch(n: int, batch_size: int, batch_norm: bool = False) -> int:
    """Minibatches in an epoch of ``n`` examples: ceil(n / batch_size), except that a
    BatchNorm network takes a last batch of one example together with the batch before
    (BatchNorm cannot normalise a single example in training; among DSWAG's clients a
    shard of k * batch_size + 1 examples is common)."""
    count = math.ceil(n / batch_size)
    return count - 1 if batch_norm and count > 1 and n % batch_size == 1 else count


def shard(idx: torch.Tensor, world: World | None) -> torch.Tensor:
    """This rank's share of a global batch: the r-th of N near-equal contiguous pieces."""
    if world is None or world.size == 1:
        return idx
    return torch.tensor_split(idx, world.size)[world.rank]


def check_shards(n: int, batch_size: int, iters: int, size: int, batch_norm: bool) -> None:
    """Every rank must get at least one example of every batch (two with BatchNorm)."""
    if size == 1:
        return
    smallest = min(batch_size, n - (iters - 1) * batch_size)
    need = size * (2 if batch_norm else 1)
    if smallest < need:
        raise UserError(
            f"a batch of {smallest} examples cannot be shared by {size} processes "
            f"({'two' if batch_norm else 'one'} each at least); change batch_size or "
            "BAYESAVG_NPROC"
        )
