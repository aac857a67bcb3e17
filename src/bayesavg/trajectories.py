"""Pretraining and fine-tuning runs: params + data in, posterior file out.

Each run seeds its own streams from (seed, run name), so adding or
reordering trajectories never changes another one's result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import Params, Trajectory
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


def pretrain(params: Params, prepared: Prepared, device: torch.device) -> RunResult:
    """Deterministic SGD from a seeded initialisation."""
    run_seed = derive_seed(params.seed, "pretrain")
    seed_everything(run_seed)
    model = build_model(
        params.model.name, prepared.input_shape, prepared.num_classes, params.model.kwargs()
    ).to(device)
    p = params.pretrain
    train_t, val_t = (
        tensors(prepared.train, prepared, device),
        tensors(prepared.val, prepared, device),
    )
    total = p.epochs * math.ceil(len(train_t) / p.batch_size)
    s = p.schedule
    history = train(
        model,
        sgd(model, p.momentum, p.weight_decay),
        train_t,
        epochs=p.epochs,
        batch_size=p.batch_size,
        lr=lr_at(s.kind, s.lr, s.lr_end, s.cycle_length, total),
        generator=generator(run_seed),
        val_data=val_t,
        desc="pretrain",
    )
    return RunResult(
        PosteriorFile.from_model(model, **_fields(params, prepared, "pretrain")), history
    )


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
    train_t, val_t = (
        tensors(prepared.train, prepared, device),
        tensors(prepared.val, prepared, device),
    )
    iters_per_epoch = math.ceil(len(train_t) / traj.batch_size)
    s = traj.schedule
    collector: SWAG | None = None
    after_step = None
    if traj.collect is not None:
        num_params = start.theta.numel()
        collector = SWAG(num_params, traj.collect.max_rank, device=device)
        first = traj.collect.start_epoch * iters_per_epoch
        every = traj.collect_every(iters_per_epoch)

        def after_step(i: int) -> None:
            if i >= first and (i - first + 1) % every == 0:
                collector.collect(model)

    history = train(
        model,
        sgd(model, traj.momentum, traj.weight_decay),
        train_t,
        epochs=traj.epochs,
        batch_size=traj.batch_size,
        lr=lr_at(s.kind, s.lr, s.lr_end, s.cycle_length, traj.epochs * iters_per_epoch),
        generator=generator(run_seed),
        val_data=val_t,
        after_step=after_step,
        desc=f"finetune {name}",
    )
    posterior = PosteriorFile.from_model(model, **_fields(params, prepared, name))
    if collector is not None:
        posterior.collector = collector.state_dict()
    return RunResult(posterior, history)


__all__ = ["RunResult", "finetune", "pretrain", "tensors"]
