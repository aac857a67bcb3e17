"""How a prepared split is stored: one ``.pt`` read whole into memory, or uint8 arrays
(``.npy``) that are memory-mapped and streamed to the device batch by batch.

``auto`` streams when the training split would take more than a quarter of the host's
RAM, or of the GPU's memory when the pipeline trains on one: what training holds
besides the images (the network, optimizer state, SWAG's moments, activations) needs
the rest. ``.npy`` because numpy memory-maps it without a copy and every tool reads it.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from ..runtime.errors import UserError
from ..runtime.io import atomic_path

STORAGE = ("auto", "memory", "stream")
SHARE = 0.25
CHUNK = 1024  # images written (and counted) at a time: bounded memory whatever the split


def host_memory() -> int:
    """Total physical RAM in bytes (total, not free: the choice must not depend on what
    else happens to run while the data stage does)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_memory(device: torch.device) -> int | None:
    """Total memory of a CUDA device in bytes; None for the CPU."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def choose(storage: str, nbytes: int, device: torch.device) -> str:
    """``memory`` or ``stream`` for a training split of ``nbytes`` (uint8) on ``device``."""
    if storage != "auto":
        return storage
    budget = min(m for m in (host_memory(), device_memory(device)) if m is not None)
    return "stream" if nbytes > SHARE * budget else "memory"


def write_array(path: Path, shape: tuple[int, ...], rows: Callable[[int, int], np.ndarray]) -> None:
    """A uint8 ``.npy`` of ``shape`` filled ``CHUNK`` rows at a time from ``rows(i, j)``,
    atomically: memory stays bounded by one chunk whatever the split's size."""
    with atomic_path(path) as tmp:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        for i in range(0, shape[0], CHUNK):
            j = min(i + CHUNK, shape[0])
            out[i:j] = rows(i, j)
        out.flush()
        del out


# id -> the tensors read_array returned, while they live (a copy of rows is not among
# them); by id because a tensor's == is elementwise (a WeakSet would call it)
_MAPPED: dict[int, weakref.ref[torch.Tensor]] = {}


def read_array(path: Path) -> torch.Tensor:
    """A ``.npy`` memory-mapped as a tensor: pages are read when indexed, not now.
    Copy-on-write (``mmap_mode='c'``): the tensor is writable in memory (torch wants
    that) while the file is never modified."""
    try:
        mapped = torch.from_numpy(np.load(path, mmap_mode="c"))
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {path} ({err}); rerun the data stage") from None
    key = id(mapped)
    _MAPPED[key] = weakref.ref(mapped, lambda _: _MAPPED.pop(key, None))
    return mapped


def is_mapped(x: torch.Tensor) -> bool:
    """Whether ``x`` is a split ``read_array`` mapped (not a copy of some of its rows):
    such a split stays on the host and is read a batch at a time."""
    ref = _MAPPED.get(id(x))
    return ref is not None and ref() is x


def chunks(n: int) -> Iterator[tuple[int, int]]:
    for i in range(0, n, CHUNK):
        yield i, min(i + CHUNK, n)


def channel_stats_streamed(x: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and (unbiased) std of uint8 images scaled to [0, 1], from exact
    per-channel histograms of the 256 values, a chunk at a time: for a split larger than
    memory. Agrees with ``prepared.channel_stats`` to rounding (tested)."""
    channels = x.shape[1]
    counts = torch.zeros(channels, 256, dtype=torch.int64)
    step = max(1, 2**24 // max(1, x[0].numel()))
    for i in range(0, x.shape[0], step):
        block = x[i : i + step].transpose(0, 1)
        for c in range(channels):
            counts[c] += torch.bincount(block[c].reshape(-1), minlength=256)
    values = torch.arange(256, dtype=torch.float64) / 255
    n = counts.sum(1).double()
    mean = (counts.double() * values).sum(1) / n
    var = (counts.double() * (values - mean[:, None]) ** 2).sum(1) / (n - 1).clamp(min=1)
    # NumPy's root is the correctly rounded one; torch.sqrt's last bit follows the CPU
    return mean.tolist(), np.sqrt(var.numpy()).clip(min=1e-6).tolist()
