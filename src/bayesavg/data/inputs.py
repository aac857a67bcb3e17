"""Model input made one batch at a time from uint8 images.

Evaluation, the BatchNorm pass and monitoring read their inputs a slice at a
time (``x.shape[0]``, ``x[i:j]``, ``x.device``). ``Inputs`` answers those from
the uint8 images, normalising each slice when it is read, so a split never
exists whole as float32 (four times its uint8 bytes): not on the GPU, and not
in RAM for a split memory-mapped from its file (``data.storage: stream``),
which stays on the host and is read a batch at a time. A slice applies the
elementwise operations of ``prepared.to_input`` to its rows, so it is bitwise
the slice of the whole normalised split. ``Chained`` puts several inputs end to
end (every split and OOD set of one evaluation) with the batch boundaries of
their concatenation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .storage import is_mapped


def constant(values: Sequence[float], device: torch.device) -> torch.Tensor:
    """Per-channel constants shaped to broadcast over (N, C, H, W), built on ``device``
    once: per batch they would be a host-to-device copy, a synchronisation, each."""
    return torch.tensor(list(values), dtype=torch.float32, device=device).view(1, -1, 1, 1)


def normalise(
    x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, channels_last: bool
) -> torch.Tensor:
    """uint8 images -> float32 model input: the elementwise operations of
    ``prepared.to_input``, so any batch is bitwise those rows of the whole split."""
    xf = x.to(dtype=torch.float32).div_(255).sub_(mean).div_(std)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    return xf.contiguous(memory_format=layout)


class Inputs:
    """Normalised float32 input of ``images`` (uint8, N, C, H, W), or of the ``rows`` of
    them in that order, on ``device``. Images in memory move to the device once, as
    uint8; memory-mapped ones stay on the host and are read when sliced."""

    def __init__(
        self,
        images: torch.Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        device: torch.device | str = "cpu",
        rows: torch.Tensor | None = None,
        channels_last: bool = False,
    ) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype}")
        self.device = torch.device(device)
        self.images = images if is_mapped(images) else images.to(self.device)
        self.rows = None if rows is None else rows.to(self.images.device)
        self.mean, self.std = list(mean), list(std)
        self.channels_last = channels_last
        self._m, self._s = constant(self.mean, self.device), constant(self.std, self.device)

    @property
    def shape(self) -> torch.Size:
        n = self.images.shape[0] if self.rows is None else self.rows.shape[0]
        return torch.Size((n, *self.images.shape[1:]))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: slice | torch.Tensor) -> torch.Tensor:
        """The normalised rows of a slice (step 1) or of an index tensor."""
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise ValueError("Inputs are read in contiguous slices")
            at = slice(start, stop) if self.rows is None else self.rows[start:stop]
            picked = self.images[at]
        else:
            at = key.to(self.images.device)
            picked = self.images[at if self.rows is None else self.rows[at]]
        return normalise(picked.to(self.device), self._m, self._s, self.channels_last)

    def subset(self, rows: torch.Tensor) -> Inputs:
        """The inputs of ``rows`` (positions in these), read when sliced, as these are."""
        rows = rows.to(self.images.device)
        picked = rows if self.rows is None else self.rows[rows]
        return Inputs(self.images, self.mean, self.std, self.device, picked, self.channels_last)


class Chained:
    """``parts`` end to end, as ``torch.cat`` of them would be, read a slice at a time:
    a slice across two parts is the two pieces concatenated, so a batch holds the rows
    it would hold in the concatenation."""

    def __init__(self, parts: Sequence[torch.Tensor | Inputs], device: torch.device | str) -> None:
        if not parts:
            raise ValueError("nothing to chain")
        self.parts = list(parts)
        self.device = torch.device(device)
        ends = [0]
        for part in self.parts:
            ends.append(ends[-1] + part.shape[0])
        self._ends = ends

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self._ends[-1], *self.parts[0].shape[1:]))

    def __len__(self) -> int:
        return self._ends[-1]

    def __getitem__(self, key: slice) -> torch.Tensor:
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("chained inputs are read in contiguous slices")
        pieces = []
        for part, lo, hi in zip(self.parts, self._ends, self._ends[1:], strict=False):
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                pieces.append(part[a - lo : b - lo].to(self.device))
        if not pieces:
            return self.parts[0][0:0].to(self.device)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


# what evaluation, the BatchNorm pass and the loss functions read a slice at a time
Input = torch.Tensor | Inputs | Chained
