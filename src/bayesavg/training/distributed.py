"""torch.distributed for logical clients: env:// ranks, results taken in client order.

A run is launched by torchrun (``bayesavg.runtime.launch``), which sets RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every process, or runs in one
process without any of them: then there is no process group at all. The
backend is gloo on CPU and NCCL on CUDA.

Results must not depend on the number of processes. Float sums do: an
``all_reduce`` adds in an order that depends on the world size. So the
clients of a step are dealt out round-robin over the ranks by their
position, each rank sends every result to rank 0 as soon as it is
computed, and rank 0 takes them in client order (``in_client_order``).
Rank 0 holds one result at a time, every other rank the one it is
computing: memory per rank stays O(d) whatever the number of clients.
Every rank sets its intra-op thread count (``numerics.threads``) before any
work: unset, 1 thread per rank (``DEFAULT_THREADS``), so N ranks never run more
threads than one process would. CPU kernels can round differently with
another thread count, so N ranks give the bytes of one process run with the
ranks' thread count (``BAYESAVG_THREADS=1``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..runtime.errors import UserError
from ..runtime.launch import is_rank
from ..runtime.numerics import threads


@dataclass(frozen=True)
class World:
    """This process's place in the run: ``rank`` of ``size`` processes."""

    rank: int
    size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def owner(self, position: int) -> int:
        """The rank that computes the item at ``position`` of an ordered list."""
        return position % self.size


def local_device(device: torch.device) -> torch.device:
    """On CUDA, the GPU of this rank (LOCAL_RANK) when several processes share a node;
    ``cuda:N`` names one GPU, kept for one process and refused for several."""
    if device.type == "cuda" and "LOCAL_RANK" in os.environ:
        if device.index is not None:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            if local == 1:
                return device
            raise UserError(
                f"device: {device} names one GPU, but the {local} processes on this node "
                "need one each: use device: cuda (process i on GPU i; CUDA_VISIBLE_DEVICES "
                "chooses which)"
            )
        index, count = int(os.environ["LOCAL_RANK"]), torch.cuda.device_count()
        if index >= count:
            raise UserError(
                f"process {index} of this node has no GPU of its own ({count} visible): set "
                f"BAYESAVG_NPROC to at most {count}"
            )
        return torch.device("cuda", index)
    return device


def join(device: torch.device) -> World:
    """Join the run this process belongs to (env://), or stand alone (world size 1).

    Sets the thread count first, so a rank computes exactly what the single
    process would. ``device``: this rank's (``local_device``).
    """
    torch.set_num_threads(threads())
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if size == 1:
        return World(0, 1, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method="env://",
            timeout=timedelta(minutes=30),
        )
    return World(rank, size, device)


def current_world(device: torch.device) -> World | None:
    """This rank's place when launched by torchrun, else None (one process, whose thread
    count is left as it is)."""
    return join(device) if is_rank() else None


def leave(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def joined(device: torch.device) -> Iterator[World]:
    """``join``, and ``leave`` at the end only if this call made the process group.

    A caller that runs several jobs in one torchrun (the DSWAG sweep, one per W)
    joins once around them all: a group destroyed and made again under torchrun's
    store reuses the first group's keys, so a rank dials an address that is gone
    (gloo) or reads a stale id (NCCL).
    """
    made = not dist.is_initialized()
    world = join(device)
    try:
        yield world
    finally:
        if made:
            leave(world)


def in_client_order(
    world: World,
    clients: Sequence[int],
    work: Callable[[int], torch.Tensor],
    take: Callable[[int, torch.Tensor], None],
    shape: tuple[int, ...],
) -> None:
    """Compute ``work(client)`` on the rank that owns it; rank 0 calls ``take`` in client order.

    ``work`` returns a float64 tensor of ``shape`` (the same for every
    client); ``take`` runs on rank 0 only, once per client, in the order of
    ``clients``, so whatever it accumulates is the same for any world size.
    """
    # rank 0's receive buffer (one result: for a DSWAG client's snapshots of a large
    # network, gigabytes), only where there is something to receive
    receiving = world.is_main and world.size > 1
    buffer = torch.empty(shape, dtype=torch.float64, device=world.device) if receiving else None
    sending: tuple[dist.Work, torch.Tensor] | None = None  # one result in flight per rank
    for position, client in enumerate(clients):
        owner = world.owner(position)
        if owner == world.rank:
            result = work(client)
            if result.shape != shape or result.dtype != torch.float64:
                raise ValueError(f"client {client}: result {tuple(result.shape)}, expected {shape}")
            if world.is_main:
                take(client, result)
            else:
                if sending is not None:
                    sending[0].wait()
                result = result.to(world.device)
                sending = (dist.isend(result, dst=0), result)
        elif world.is_main:
            assert buffer is not None
            dist.recv(buffer, src=owner)
            take(client, buffer)
    if sending is not None:
        sending[0].wait()


def broadcast(world: World, tensor: torch.Tensor) -> torch.Tensor:
    """Rank 0's ``tensor`` on every rank (in place where it already has the right shape)."""
    if world.size > 1:
        on_device = tensor.to(world.device)
        dist.broadcast(on_device, src=0)
        tensor.copy_(on_device)
    return tensor
