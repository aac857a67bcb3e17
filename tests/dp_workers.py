"""Tiny data-parallel training problems and the body of a spawned rank, for
tests/test_data_parallel.py.

A module of its own so that spawned children import only this and bayesavg.
Every rank rebuilds the same problem from a seed (images, labels, params) and
runs the library's own ``finetune`` / ``pretrain_members`` with a ``Compute``
for its place in the group; each rank also reports its final weights, so the
test can check that the replicas never drift apart.
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bayesavg.config import parse_params
from bayesavg.data.datasets import Split
from bayesavg.data.prepared import Prepared, channel_stats
from bayesavg.posteriors.file import PosteriorFile
from bayesavg.runtime.checkpoint import Checkpoint
from bayesavg.training.distributed import World
from bayesavg.training.flat import params_vector
from bayesavg.training.train import Compute
from bayesavg.trajectories import finetune, pretrain_members, run

RANK_TIMEOUT = timedelta(seconds=90)
CLASSES = 3


def prepared(n_train: int = 96, side: int = 8, seed: int = 0) -> Prepared:
    """Learnable 1 x side x side images: each class brightens its own band of rows."""
    g = torch.Generator().manual_seed(seed)

    def split(n: int) -> Split:
        y = torch.randint(0, CLASSES, (n,), generator=g)
        x = torch.randint(0, 120, (n, 1, side, side), generator=g)
        band = side // CLASSES
        for c in range(CLASSES):
            x[y == c, :, c * band : (c + 1) * band] += 100
        return Split(x.to(torch.uint8), y)

    train, val, test = split(n_train), split(32), split(32)
    mean, std = channel_stats(train.x)
    manifest = {
        "dataset": "synthetic",
        "seed": seed,
        "test_fraction": 0.2,
        "val_fraction": 0.2,
        "num_classes": CLASSES,
        "input_shape": [1, side, side],
        "mean": mean,
        "std": std,
    }
    return Prepared(train, val, test, manifest)


def params(members: int = 1) -> Any:
    opt = {"epochs": 3, "batch_size": 16, "momentum": 0.9, "weight_decay": 0.0005}
    collect = {"start_epoch": 0, "every": 0, "max_rank": 5}
    vi = {"sigma_init": 0.03, "prior_sigma": 1.0, "mc_samples": 1, "optimizer": "adam"}
    adam = {"momentum": 0.0, "weight_decay": 0.0, "schedule": {"kind": "cosine", "lr": 0.01}}
    raw = {
        "model": {"name": "mlp", "hidden": [16]},
        "pretrain": {**opt, "members": members, "schedule": {"kind": "cosine", "lr": 0.05}},
        "finetune": {
            "swag": {
                **opt,
                "start": "pretrain",
                "collect": collect,
                "schedule": {"kind": "constant", "lr": 0.02},
            },
            "fswag": {
                **opt,
                "start": "pretrain",
                "collect": collect,
                "sam_rho": 0.05,
                "schedule": {"kind": "constant", "lr": 0.02},
            },
            "vi": {**opt, **adam, "kind": "vi", "start": "pretrain", "vi": vi},
            "hwa": {
                **opt,
                **adam,
                "kind": "hwa",
                "start": "vi",
                "vi": vi,
                "collect": collect,
                "reset_to_average": True,
            },
            "sgld": {
                **opt,
                "kind": "sgld",
                "start": "pretrain",
                "momentum": 0.0,
                "collect": collect,
                "schedule": {"kind": "constant", "lr": 0.01},
            },
            "ensemble": {
                **opt,
                "kind": "ensemble",
                "start": "pretrain",
                "members": members,
                "schedule": {"kind": "cosine", "lr": 0.02},
            },
        },
        "evaluate": {"predictors": {"swag": {"map": {"method": "map"}}}},
    }
    return parse_params(raw)


def _replicas_agree(world: World | None) -> bool:
    """Whether every rank's last trained network (recorded by the ``run`` hook) is the same."""
    theta = _last_trained["theta"]
    if world is None:
        return True
    gathered = [torch.empty_like(theta) for _ in range(world.size)]
    dist.all_gather(gathered, theta)
    return all(torch.equal(g, theta) for g in gathered)


_last_trained: dict[str, torch.Tensor] = {}


def _record(plan_fn):
    """Wrap ``run.run_plan`` to keep the trained weights of this rank."""

    def wrapped(plan, *args, **kwargs):
        history = plan_fn(plan, *args, **kwargs)
        _last_trained["theta"] = params_vector(plan.trained.parameters()).detach().clone()
        return history

    return wrapped


def rank_main(rank: int, world_size: int, folder: str, jobs: list[tuple[str, dict]]) -> None:
    """One spawned rank: every job in one gloo group; rank 0 saves each job's posterior
    and history as ``<job>-<world>.pt``, every rank whether its replica agreed."""
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)
    torch.set_num_threads(1)
    out = Path(folder)
    run.run_plan = _record(run.run_plan)
    import bayesavg.trajectories as trajectories

    trajectories.run_plan = run.run_plan
    try:
        world = None
        if world_size > 1:
            dist.init_process_group(
                "gloo",
                init_method=f"file://{out / f'store-{world_size}'}",
                rank=rank,
                world_size=world_size,
                timeout=RANK_TIMEOUT,
            )
            world = World(rank, world_size, torch.device("cpu"))
        compute = Compute(world=world)
        for job, spec in jobs:
            result, agree = run_job(job, spec, compute, world, out)
            if rank == 0:
                assert result is not None, f"{job}: rank 0 got no result"
                torch.save(
                    {"posterior": result.posterior.to_dict(), "history": result.history},
                    out / f"{job}-{world_size}.pt",
                )
            else:
                assert result is None, f"{job}: rank {rank} got a result"
            (out / f"agree-{job}-{world_size}-{rank}").write_text(str(agree))
        if world is not None:
            dist.destroy_process_group()
    except BaseException:
        (out / f"error-{world_size}-{rank}.txt").write_text(traceback.format_exc())
        raise


def run_job(job: str, spec: dict, compute: Compute, world: World | None, out: Path):
    """One trajectory (or pretraining) of the problem; ``spec['resume_after']`` stops a
    first attempt at that epoch and resumes it from its checkpoint."""
    members = spec.get("members", 1)
    p = params(members)
    data = prepared()
    device = torch.device("cpu")
    start = pretrain_members(p, data, device, compute=Compute()).posterior
    name = spec["trajectory"]
    if name == "pretrain":
        return pretrain_members(p, data, device, compute=compute), True
    if p.finetune[name].start != "pretrain":
        start = _solo_start(p, p.finetune[name].start, data, start)
    ckpt = None
    if "resume_after" in spec:
        ckpt = Checkpoint(out / f"ckpt-{job}-{compute.size}.pt", "key", every=1)
        _interrupted(
            spec["resume_after"],
            lambda: finetune(
                p, name, data, start, device, ckpt if compute.is_main else None, compute
            ),
        )
        if compute.is_main:
            ckpt.load()
    result = finetune(p, name, data, start, device, ckpt if compute.is_main else None, compute)
    # an ensemble's members are spread over the ranks: no replicas to compare (test_data_
    # parallel's members test compares them with the sequential ones)
    agree = None if p.finetune[name].kind == "ensemble" else _replicas_agree(world)
    return result, agree


class _Stop(Exception):
    """The simulated kill of a run, on every rank after the same epoch."""


def _interrupted(stop: int, attempt) -> None:
    """Run ``attempt`` with every rank stopping right after epoch ``stop``'s checkpoint."""
    train = run.train

    def stopping(*args, on_epoch, **kwargs):
        def hook(progress):
            on_epoch(progress)
            if progress.epoch == stop:
                raise _Stop

        return train(*args, on_epoch=hook, **kwargs)

    run.train = stopping
    try:
        attempt()
    except _Stop:
        pass
    finally:
        run.train = train


def _solo_start(p: Any, name: str, data: Prepared, pre: PosteriorFile) -> PosteriorFile:
    """A trajectory's start trained on one process (hwa continues vi)."""
    result = finetune(p, name, data, pre, torch.device("cpu"), compute=Compute())
    assert result is not None
    return result.posterior
