"""Tiny distributed-SWAG problems and the body of a spawned rank, for tests/test_dswag.py.

A module of its own (not the test file) so that ``torch.multiprocessing``'s
spawned children import only this and bayesavg. Every problem is rebuilt from
a plain dict in each process (data, network and trajectory), so the parent
and its children start from the same bytes without sending tensors across.
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bayesavg.config import DSWAGTrajectory
from bayesavg.dswag.rounds import run_dswag
from bayesavg.models import build_model
from bayesavg.training.batches import Tensors

CLASSES = 3
RANK_TIMEOUT = timedelta(seconds=60)  # a rank stuck in a collective fails rather than hangs


def problem_spec(
    traj: dict[str, Any],
    *,
    n_train: int = 360,
    features: int = 12,
    hidden: tuple[int, ...] = (16,),
    batch_norm: bool = False,
    dropout: float = 0.0,
    seed: int = 7,
    data_seed: int = 0,
    float64: bool = False,
) -> dict[str, Any]:
    """A picklable description of one run: trajectory params, data and network shape.

    ``float64``: the network and inputs in double precision. Then theta_T is the FedAvg
    sum itself, so a sum taken in another order shows in the result; in float32 the
    float64 sum's last bits are rounded away and almost any order gives the same bytes.
    """
    return {
        "traj": {"kind": "dswag", **traj},
        "n_train": n_train,
        "features": features,
        "hidden": list(hidden),
        "batch_norm": batch_norm,
        "dropout": dropout,
        "seed": seed,
        "data_seed": data_seed,
        "dtype": torch.float64 if float64 else torch.float32,
    }


def model_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"hidden": spec["hidden"], "dropout": spec["dropout"]}
    if spec["batch_norm"]:
        kwargs["batch_norm"] = True
    return kwargs


def input_shape(spec: dict[str, Any]) -> tuple[int, int, int]:
    return (1, 1, spec["features"])


def make_net(spec: dict[str, Any]) -> torch.nn.Module:
    """The starting network, the same in every process (its own seeded stream)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"] + 1000)
        net = build_model("mlp", input_shape(spec), CLASSES, model_kwargs(spec))
    return net.to(spec["dtype"])


def make_splits(spec: dict[str, Any]) -> dict[str, Tensors]:
    """Three Gaussian blobs in ``features`` dimensions, overlapping enough that training
    keeps moving; val and test a quarter of train each."""
    g = torch.Generator().manual_seed(spec["data_seed"])
    centres = 0.5 * torch.randn(CLASSES, spec["features"], generator=g)
    out = {}
    for name, n in (("train", spec["n_train"]), ("val", spec["n_train"] // 4)):
        y = torch.randint(0, CLASSES, (n,), generator=g)
        x = centres[y] + torch.randn(n, spec["features"], generator=g)
        out[name] = Tensors(x.to(spec["dtype"]), y)
    n = spec["n_train"] // 4
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = centres[y] + torch.randn(n, spec["features"], generator=g)
    out["test"] = Tensors(x.to(spec["dtype"]), y)
    return out


def fields(spec: dict[str, Any], name: str = "dswag") -> dict[str, Any]:
    """What ``PosteriorFile.from_model`` needs besides the network."""
    return {
        "trajectory": name,
        "model_name": "mlp",
        "model_kwargs": model_kwargs(spec),
        "input_shape": input_shape(spec),
        "mean": [0.0],
        "std": [1.0],
        "num_classes": CLASSES,
        "data": {"dataset": "synthetic", "seed": spec["data_seed"]},
    }


def trajectory(spec: dict[str, Any]) -> DSWAGTrajectory:
    return DSWAGTrajectory.model_validate(spec["traj"])


def run_spec(spec: dict[str, Any]) -> tuple[Any, list[dict[str, float]]] | None:
    """``run_dswag`` on the problem, in whatever process group this process is in."""
    splits = make_splits(spec)
    net = make_net(spec)
    return run_dswag(
        spec["seed"],
        "dswag",
        trajectory(spec),
        net,
        splits,
        splits["train"].y.clone(),
        fields(spec),
    )


def rank_main(rank: int, world: int, folder: str, jobs: list[tuple[str, dict[str, Any]]]) -> None:
    """One spawned rank: every job in its own gloo group (a fresh file store); rank 0
    saves each job's (posterior, history) as ``<job>-<world>.pt`` in ``folder``, every
    rank an ``ok-<job>-<world>-<rank>`` marker saying what run_dswag returned."""
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    out = Path(folder)
    try:
        for job, spec in jobs:
            store = out / f"store-{job}-{world}"
            dist.init_process_group(
                "gloo",
                init_method=f"file://{store}",
                rank=rank,
                world_size=world,
                timeout=RANK_TIMEOUT,
            )
            result = run_spec(spec)
            # the group was made here, so run_dswag must leave it to its maker (the DSWAG
            # sweep runs every W in one group: distributed.joined)
            if not dist.is_initialized():
                raise AssertionError("run_dswag left a process group it did not make")
            dist.destroy_process_group()
            if rank == 0:
                assert result is not None, "rank 0 got no result"
                posterior, history = result
                torch.save(
                    {"posterior": posterior.to_dict(), "history": history},
                    out / f"{job}-{world}.pt",
                )
            (out / f"ok-{job}-{world}-{rank}").write_text("none" if result is None else "result")
    except BaseException:
        (out / f"error-{world}-{rank}.txt").write_text(traceback.format_exc())
        raise
