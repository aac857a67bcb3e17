"""Pretraining and fine-tuning runs: params + data in, posterior file out.

Each run seeds its own streams from (seed, run name), so adding or
reordering trajectories never changes another one's result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .config import Params, PretrainParams, Trajectory
from .data import Prepared, Split, to_input
from .models import build_model
from .posterior_file import PosteriorFile
from .posteriors import SWAG
from .seeding import derive_seed, generator, seed_everything
from .train import Tensors, lr_at, sgd, train


@dataclass(frozen=True)
class RunResult:
    posterior: PosteriorFile
    history: list[dict[str, float]]


def tensors(split: Split, prepared: Prepared, device: torch.device) -> Tensors:
    m = prepared.manifest
    return Tensors(to_input(split.x, m["mean"], m["std"], device), split.y.to(device))


def _fields(params: Params, prepared: Prepared, trajectory: str) -> dict[str, object]:
    m = prepared.manifest
    return {
        "trajectory": trajectory,
        "model_name": params.model.name,
        "model_kwargs": params.model.kwargs(),
        "input_shape": prepared.input_shape,
        "mean": m["mean"],
        "std": m["std"],
        "num_classes": prepared.num_classes,
        "data": {k: m[k] for k in ("dataset", "seed", "test_fraction", "val_fraction")},
    }


def _sgd_run(
    model: torch.nn.Module,
    opts: PretrainParams | Trajectory,
    prepared: Prepared,
    device: torch.device,
    run_seed: int,
    desc: str,
    after_step: Callable[[int], None] | None = None,
) -> list[dict[str, float]]:
    """SGD with ``opts``' schedule over the train split, validating each epoch."""
    train_t = tensors(prepared.train, prepared, device)
    total = opts.epochs * iterations_per_epoch(len(train_t), opts.batch_size)
    s = opts.schedule
    return train(
        model,
        sgd(model, opts.momentum, opts.weight_decay),
        train_t,
        epochs=opts.epochs,
        batch_size=opts.batch_size,
        lr=lr_at(s.kind, s.lr, s.lr_end, s.cycle_length, total),
        generator=generator(run_seed),
        val_data=tensors(prepared.val, prepared, device),
        after_step=after_step,
        desc=desc,
    )


def iterations_per_epoch(n: int, batch_size: int) -> int:
    return math.ceil(n / batch_size)


def pretrain(params: Params, prepared: Prepared, device: torch.device) -> RunResult:
    """Deterministic SGD from a seeded initialisation."""
    run_seed = derive_seed(params.seed, "pretrain")
    seed_everything(run_seed)
    model = build_model(
        params.model.name, prepared.input_shape, prepared.num_classes, params.model.kwargs()
    ).to(device)
    history = _sgd_run(model, params.pretrain, prepared, device, run_seed, "pretrain")
    posterior = PosteriorFile.from_model(model, **_fields(params, prepared, "pretrain"))
    return RunResult(posterior, history)


def finetune(
    params: Params,
    name: str,
    prepared: Prepared,
    start: PosteriorFile,
    device: torch.device,
) -> RunResult:
    """Continue from ``start`` along trajectory ``name``; collect SWAG moments if asked."""
    traj: Trajectory = params.finetune[name]
    run_seed = derive_seed(params.seed, "finetune", name)
    seed_everything(run_seed)
    model = start.build_model(device).train()
    collector: SWAG | None = None
    after_step = None
    if traj.collect is not None:
        collector = SWAG(start.theta.numel(), traj.collect.max_rank, device=device)
        per_epoch = iterations_per_epoch(len(prepared.train), traj.batch_size)
        first = traj.collect.start_epoch * per_epoch
        every = traj.collect_every(per_epoch)

        def after_step(i: int) -> None:
            if i >= first and (i - first + 1) % every == 0:
                collector.collect(model)

    history = _sgd_run(model, traj, prepared, device, run_seed, f"finetune {name}", after_step)
    posterior = PosteriorFile.from_model(model, **_fields(params, prepared, name))
    if collector is not None:
        posterior.collector = collector.state_dict()
    return RunResult(posterior, history)
