"""Spawning a few torch.distributed ranks for a test, never hanging it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp


def spawn_ranks(
    target: Callable[..., None],
    world: int,
    args: tuple[Any, ...],
    folder: Path,
    deadline: float,
    errors: str = "error-*.txt",
) -> None:
    """Run ``target(rank, *args)`` on ``world`` spawned processes; fail (never hang) if any
    rank fails or is still running after ``deadline`` seconds, with the tracebacks the
    ranks wrote to ``folder`` (files matching ``errors``)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(rank, *args), daemon=True) for rank in range(world)]
    for proc in procs:
        proc.start()
    end = time.monotonic() + deadline
    for proc in procs:
        proc.join(max(0.0, end - time.monotonic()))
    hung = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    found = "\n".join(p.read_text() for p in sorted(folder.glob(errors)))
    assert not hung, f"ranks {hung} of {world} still running after {deadline} s\n{found}"
    codes = [proc.exitcode for proc in procs]
    assert codes == [0] * world, f"exit codes {codes} on {world} processes\n{found}"
