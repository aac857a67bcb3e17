"""Several independent runs of one stage (ensemble members, pretrained members): one after
the other on one process, spread across ranks on several.

Each member seeds all its streams from its own seed, so where it runs does
not change its bytes: member m on rank m mod N, with the same thread count,
is bitwise the member trained in sequence. Rank 0 gathers the finished
members in member order. The checkpoint holds the finished members and, on
one process, the state of the member in training (``{"member", "done",
"run"}``); on N processes it is saved after each round of N members.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..runtime.checkpoint import Resumable
from ..training.distributed import World
from .common import RunResult

TrainMember = Callable[[int, Resumable | None], RunResult]


def train_members(
    count: int, train_member: TrainMember, resume: Resumable | None, world: World | None = None
) -> list[RunResult] | None:
    """Members 0..count-1 in order on rank 0 (None on the other ranks)."""
    if world is not None and world.size > 1:
        return _spread(count, train_member, resume, world)
    saved = resume.state if resume is not None else None
    done = [RunResult.from_state_dict(d) for d in saved["done"]] if saved else []
    for member in range(len(done), count):
        nested = None
        if resume is not None:
            finished = [r.state_dict() for r in done]
            run_state = saved["run"] if saved and saved["member"] == member else None
            nested = resume.nested(
                run_state,
                lambda state, m=member, f=finished: {"member": m, "done": f, "run": state},
            )
        done.append(train_member(member, nested))
        _save(resume, done)
    return done


def _spread(
    count: int, train_member: TrainMember, resume: Resumable | None, world: World
) -> list[RunResult] | None:
    import torch.distributed as dist

    saved = resume.state if resume is not None and world.is_main else None
    done = [RunResult.from_state_dict(d) for d in saved["done"]] if saved else []
    first: list[object] = [len(done)]
    dist.broadcast_object_list(first, src=0)
    for round_start in range(int(first[0]), count, world.size):
        member = round_start + world.rank
        mine = train_member(member, None).state_dict() if member < count else None
        # to rank 0 only: an all-gather would make every rank hold (and, under NCCL,
        # stage on its GPU) every member's whole posterior, gigabytes for large networks
        results: list[object] | None = [None] * world.size if world.is_main else None
        dist.gather_object(mine, results, dst=0)
        if results is not None:
            done.extend(RunResult.from_state_dict(r) for r in results if r is not None)
            _save(resume, done)
    return done if world.is_main else None


def _save(resume: Resumable | None, done: list[RunResult]) -> None:
    if resume is not None and resume.active:
        finished = [r.state_dict() for r in done]
        resume.save({"member": len(done), "done": finished, "run": None})


def stacked(runs: list[RunResult]) -> dict[str, object]:
    """The members' weights and buffers as a posterior file's ``samples``, with their SWAG
    moments (``collectors``) when they collected snapshots."""
    out: dict[str, object] = {
        "theta": torch.stack([r.posterior.theta for r in runs]),
        "buffers": [r.posterior.buffers for r in runs],
    }
    if all(r.posterior.collector is not None for r in runs):
        out["collectors"] = [r.posterior.collector for r in runs]
    return out
