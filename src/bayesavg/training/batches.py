"""The training split on the device and how an epoch cuts it into batches.

The loop (``train``) asks a split for an epoch's batches in a given order:
``Tensors`` holds pre-normalised rows, ``TrainData`` keeps uint8 images and
normalises (and augments) each batch, ``StreamedData`` reads them from a
memory-mapped file and streams them to the device. How many batches an epoch has, and which
share of each a rank takes, are decided here, once for every trajectory kind.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from ..data.inputs import Inputs, constant, normalise
from ..runtime.errors import UserError
from .augment import Augment, EpochDraws, apply
from .distributed import World


class ByIndex:
    """An epoch of a split whose subclass gives each batch by index (``batch(idx, draws)``)."""

    batch: Callable[..., tuple[torch.Tensor, torch.Tensor]]

    def epoch(
        self,
        order: Order,
        bounds: list[tuple[int, int]],
        world: World | None,
        draws: EpochDraws | None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, float]]:
        """An epoch's batches in ``order``: (inputs, labels, this rank's share of the batch)."""
        for start, end in bounds:
            idx = order.device[start:end]
            local = shard(idx, world)
            yield (*self.batch(local, draws), local.shape[0] / idx.shape[0])


@dataclass(frozen=True)
class Tensors(ByIndex):
    """Model-ready inputs (float, normalised, or ``Inputs`` normalised as they are read)
    and labels, on the device."""

    x: torch.Tensor | Inputs
    y: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[0]

    def batch(
        self, idx: torch.Tensor, draws: EpochDraws | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.y[idx]


@dataclass(frozen=True)
class TrainData(ByIndex):
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
    # the constants on the labels' device, built once (data.inputs.constant)
    _m: torch.Tensor = field(init=False, repr=False, compare=False)
    _s: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_m", constant(self.mean, self.y.device))
        object.__setattr__(self, "_s", constant(self.std, self.y.device))

    def __len__(self) -> int:
        return self.x.shape[0]

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        return normalise(x, self._m, self._s, self.channels_last)

    def batch(
        self, idx: torch.Tensor, draws: EpochDraws | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._finish(self.x[idx], idx, draws)

    def _finish(
        self, x: torch.Tensor, idx: torch.Tensor, draws: EpochDraws | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images of ``idx`` on the device -> augmented, normalised inputs and labels."""
        if draws is not None:
            x = apply(x, draws.take(idx), self.augment)
        return self._normalise(x), self.y[idx]

    def inputs(self) -> Inputs:
        """The split normalised, not augmented, a batch at a time as it is read (BatchNorm
        recomputation, monitoring): never whole as float32, streamed or not."""
        return Inputs(self.x, self.mean, self.std, self.y.device, None, self.channels_last)


@dataclass(frozen=True)
class StreamedData(TrainData):
    """The training split memory-mapped on the host (``data.storage``), streamed to the
    device. On CUDA, ``prefetch`` batches ahead, ``workers`` threads gather each
    batch's images from the file (page faults and memcpy in torch, outside the GIL)
    into pinned memory and copy them on a side stream, non-blocking, while the GPU
    trains on the batch before. On the CPU each batch is gathered when its turn comes.
    Either way a batch then takes exactly the in-memory path's operations
    (``TrainData._finish``): the same order, augmentation and normalisation, so the
    posterior is bitwise the in-memory one (tested on the CPU).
    """

    prefetch: int = 4
    workers: int | None = None  # None: 2 on CUDA, none (in turn) on the CPU

    def batch(
        self, idx: torch.Tensor, draws: EpochDraws | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, ready = self._fetch(idx.cpu())
        self._wait(x, ready)
        return self._finish(x, idx, draws)

    def epoch(
        self,
        order: Order,
        bounds: list[tuple[int, int]],
        world: World | None,
        draws: EpochDraws | None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, float]]:
        workers = self.workers
        if workers is None:
            # Nothing to overlap on the CPU: no copy, and the page-cache reads are a
            # memcpy. Worker threads there only fight torch's own threads for the cores
            # (measured: benchmarks/streaming.py), so the batches are gathered in turn.
            workers = 2 if self.y.device.type == "cuda" else 0
        if workers == 0:
            yield from super().epoch(order, bounds, world, draws)
            return
        pending: deque[Future[tuple[torch.Tensor, torch.cuda.Event | None]]] = deque()
        hosts = [shard(order.host[start:end], world) for start, end in bounds]
        with ThreadPoolExecutor(
            workers, thread_name_prefix="stream", initializer=_use_device, initargs=(self.y.device,)
        ) as pool:
            ahead = iter(hosts)
            for (start, end), _ in zip(bounds, hosts, strict=True):
                while len(pending) < self.prefetch and (nxt := next(ahead, None)) is not None:
                    pending.append(pool.submit(self._fetch, nxt))
                x, ready = pending.popleft().result()
                self._wait(x, ready)
                idx = order.device[start:end]
                local = shard(idx, world)
                yield (*self._finish(x, local, draws), local.shape[0] / idx.shape[0])

    def _fetch(self, host_idx: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """One batch's uint8 images gathered from the file and sent to the device."""
        x = torch.index_select(self.x, 0, host_idx)
        device = self.y.device
        if device.type != "cuda":
            return x.to(device), None
        stream = _copy_stream(device)
        with torch.cuda.stream(stream):
            x = x.pin_memory().to(device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(stream)
        return x, ready

    def _wait(self, x: torch.Tensor, ready: torch.cuda.Event | None) -> None:
        """The compute stream waits for the copy (no host sync); the batch's memory is
        not reused before the compute stream is done with it."""
        if ready is not None:
            current = torch.cuda.current_stream(x.device)
            current.wait_event(ready)
            x.record_stream(current)


def _use_device(device: torch.device) -> None:
    """A worker thread's CUDA device is the data's: a new thread starts on GPU 0, where
    ``pin_memory`` and leaving ``torch.cuda.stream`` would otherwise open a context of
    its own (hundreds of MB) on every rank of a multi-GPU run."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


_COPY_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for the host-to-device copies, shared by the workers."""
    if device not in _COPY_STREAMS:
        _COPY_STREAMS[device] = torch.cuda.Stream(device)
    return _COPY_STREAMS[device]


@dataclass(frozen=True)
class Order:
    """An epoch's permutation on the host (streaming gathers from the file with it) and
    on the device (labels and augmentation draws are indexed there)."""

    host: torch.Tensor
    device: torch.Tensor


def epoch_bounds(n: int, batch_size: int, iters: int) -> list[tuple[int, int]]:
    """[start, end) of each batch in an epoch's order: the last takes the remainder."""
    return [(b * batch_size, (b + 1) * batch_size if b < iters - 1 else n) for b in range(iters)]


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
