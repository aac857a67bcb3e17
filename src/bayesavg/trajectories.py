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
from .posterior_file import PosteriorFile, load_theta
from .posteriors import HWA, SWAG, MeanFieldVI, svi_step
from .posteriors.vi import softplus_inverse
from .sam import sam_step
from .seeding import derive_seed, generator, seed_everything
from .train import Step, Tensors, lr_at, sgd, sgd_step, train


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
    step: Step = sgd_step,
) -> list[dict[str, float]]:
    """SGD on ``model``'s trainable parameters with ``opts``' schedule, validating each epoch."""
    train_t = tensors(prepared.train, prepared, device)
    total = opts.epochs * iterations_per_epoch(len(train_t), opts.batch_size)
    s = opts.schedule
    trainable = [p for p in model.parameters() if p.requires_grad]
    return train(
        model,
        sgd(trainable, opts.momentum, opts.weight_decay),
        train_t,
        step=step,
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
    """Continue from ``start`` along trajectory ``name`` (SGD/SAM, VI or HWA)."""
    traj: Trajectory = params.finetune[name]
    run_seed = derive_seed(params.seed, "finetune", name)
    seed_everything(run_seed)
    model = start.build_model(device).train()
    desc = f"finetune {name}"
    if traj.kind == "sgd":
        return _finetune_sgd(params, name, traj, prepared, model, device, run_seed, desc)
    return _finetune_svi(params, name, traj, prepared, start, model, device, run_seed, desc)


def _collect_schedule(
    traj: Trajectory, n_train: int, collect: Callable[[], None]
) -> Callable[[int], None]:
    """``after_step`` that calls ``collect`` at the trajectory's snapshot iterations."""
    assert traj.collect is not None
    per_epoch = iterations_per_epoch(n_train, traj.batch_size)
    first = traj.collect.start_epoch * per_epoch
    every = traj.collect_every(per_epoch)

    def after_step(i: int) -> None:
        if i >= first and (i - first + 1) % every == 0:
            collect()

    return after_step


def _finetune_sgd(
    params: Params,
    name: str,
    traj: Trajectory,
    prepared: Prepared,
    model: torch.nn.Module,
    device: torch.device,
    run_seed: int,
    desc: str,
) -> RunResult:
    collector: SWAG | None = None
    after_step = None
    if traj.collect is not None:
        collector = SWAG(
            sum(p.numel() for p in model.parameters()), traj.collect.max_rank, device=device
        )
        after_step = _collect_schedule(traj, len(prepared.train), lambda: collector.collect(model))
    step = sam_step(traj.sam_rho) if traj.sam_rho > 0 else sgd_step
    history = _sgd_run(model, traj, prepared, device, run_seed, desc, after_step, step)
    posterior = PosteriorFile.from_model(model, **_fields(params, prepared, name))
    if collector is not None:
        posterior.collector = collector.state_dict()
    return RunResult(posterior, history)


def _finetune_svi(
    params: Params,
    name: str,
    traj: Trajectory,
    prepared: Prepared,
    start: PosteriorFile,
    model: torch.nn.Module,
    device: torch.device,
    run_seed: int,
    desc: str,
) -> RunResult:
    """SVI on (mu, rho) from the start's weights (vi) or its (mu, rho) (hwa)."""
    cfg = traj.vi
    assert cfg is not None
    vi = MeanFieldVI(model, cfg.sigma_init, cfg.prior_sigma).to(device)
    if start.rho is not None:
        with torch.no_grad():
            vi.rho.copy_(start.rho.to(device))
    hwa: HWA | None = None
    after_step = None
    if traj.kind == "hwa":
        hwa = HWA(vi.mu.numel(), traj.collect.max_rank, device=device)  # type: ignore[union-attr]

        def snapshot() -> None:
            hwa.collect(vi.mu, vi.rho)
            if traj.reset_to_average:
                with torch.no_grad():
                    vi.mu.copy_(hwa.mu.mean)
                    vi.rho.copy_(softplus_inverse(hwa.var.mean.sqrt()))

        after_step = _collect_schedule(traj, len(prepared.train), snapshot)
    step = svi_step(len(prepared.train), cfg.kl_weight, cfg.mc_samples, traj.sam_rho)
    history = _sgd_run(vi, traj, prepared, device, run_seed, desc, after_step, step)
    load_theta(model, vi.mu.detach(), {})
    posterior = PosteriorFile.from_model(model, **_fields(params, prepared, name))
    posterior.rho = vi.rho.detach().cpu().clone()
    if hwa is not None:
        posterior.hwa = hwa.state_dict()
    return RunResult(posterior, history)
