"""Pretraining and fine-tuning runs: params + data in, posterior file out.

Each run seeds its own streams from (seed, run name), so adding or
reordering trajectories never changes another one's result. Pretraining
also trains ``pretrain.members`` - 1 extra networks from their own seeds,
once for every ensemble trajectory (so F-Ensemble differs from Ensemble
only in the SAM gradient). Ensemble member 0 is the pipeline's own
pretrained network fine-tuned exactly as an sgd trajectory of the same
name would be (same seed), so an ensemble of one is that single model.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from .batchnorm import update_bn
from .config import Params, PretrainParams, Trajectory
from .data import Prepared, Split, to_input
from .errors import UserError
from .models import build_model, has_batchnorm
from .posterior_file import PosteriorFile, load_theta
from .posteriors import HWA, SWAG, MeanFieldVI, svi_step
from .posteriors.vi import softplus_inverse
from .sam import sam_step
from .seeding import derive_seed, generator, seed_everything
from .sgld import SGLD
from .train import Step, Tensors, loss_and_accuracy, lr_at, sgd, sgd_step, train


@dataclass(frozen=True)
class RunResult:
    posterior: PosteriorFile
    history: list[dict[str, float]]


def tensors(split: Split, prepared: Prepared, device: torch.device) -> Tensors:
    m = prepared.manifest
    return Tensors(to_input(split.x, m["mean"], m["std"], device), split.y.to(device))


def pretrain_seed(seed: int, member: int = 0) -> int:
    """Pretraining seed; member > 0 are the extra ensemble members."""
    return derive_seed(seed, "pretrain") if member == 0 else derive_seed(seed, "pretrain", member)


def finetune_seed(seed: int, name: str, member: int = 0) -> int:
    base = ("finetune", name) if member == 0 else ("finetune", name, member)
    return derive_seed(seed, *base)


def _fields(
    params: Params, prepared: Prepared, trajectory: str, model_kwargs: dict[str, Any]
) -> dict[str, Any]:
    m = prepared.manifest
    return {
        "trajectory": trajectory,
        "model_name": params.model.name,
        "model_kwargs": model_kwargs,
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
    optimizer: torch.optim.Optimizer | None = None,
    epoch_metrics: Callable[[], dict[str, float]] | None = None,
    train_t: Tensors | None = None,
) -> list[dict[str, float]]:
    """SGD (or ``optimizer``) on ``model``'s trainable parameters with ``opts``' schedule.

    ``train_t``: the training tensors if the caller already holds them on ``device``.
    """
    if train_t is None:
        train_t = tensors(prepared.train, prepared, device)
    total = opts.epochs * iterations_per_epoch(len(train_t), opts.batch_size)
    s = opts.schedule
    trainable = [p for p in model.parameters() if p.requires_grad]
    return train(
        model,
        optimizer or sgd(trainable, opts.momentum, opts.weight_decay),
        train_t,
        step=step,
        epochs=opts.epochs,
        batch_size=opts.batch_size,
        lr=lr_at(s.kind, s.lr, s.lr_end, s.cycle_length, total),
        generator=generator(run_seed),
        val_data=tensors(prepared.val, prepared, device),
        after_step=after_step,
        epoch_metrics=epoch_metrics,
        desc=desc,
    )


def iterations_per_epoch(n: int, batch_size: int) -> int:
    return math.ceil(n / batch_size)


def pretrain_members(params: Params, prepared: Prepared, device: torch.device) -> RunResult:
    """Member 0 (the pipeline's network), with all ``pretrain.members`` in ``samples``.

    The history is member 0's: extra members only feed ensembles.
    """
    runs = [pretrain(params, prepared, device, m) for m in range(params.pretrain.members)]
    posterior = runs[0].posterior
    if len(runs) > 1:
        posterior.samples = {
            "theta": torch.stack([r.posterior.theta for r in runs]),
            "buffers": [r.posterior.buffers for r in runs],
        }
    return RunResult(posterior, runs[0].history)


def pretrain(
    params: Params, prepared: Prepared, device: torch.device, member: int = 0
) -> RunResult:
    """Deterministic SGD from a seeded initialisation (``member`` > 0: an ensemble member's)."""
    run_seed = pretrain_seed(params.seed, member)
    seed_everything(run_seed)
    kwargs = params.model.kwargs()
    model = build_model(params.model.name, prepared.input_shape, prepared.num_classes, kwargs).to(
        device
    )
    desc = "pretrain" if member == 0 else f"pretrain member {member}"
    history = _sgd_run(model, params.pretrain, prepared, device, run_seed, desc)
    posterior = PosteriorFile.from_model(model, **_fields(params, prepared, "pretrain", kwargs))
    return RunResult(posterior, history)


def finetune(
    params: Params,
    name: str,
    prepared: Prepared,
    start: PosteriorFile,
    device: torch.device,
) -> RunResult:
    """Continue from ``start`` along trajectory ``name`` (SGD/SAM, SGLD, ensemble, VI or HWA)."""
    traj: Trajectory = params.finetune[name]
    kwargs = dict(start.model_kwargs)
    if traj.dropout is not None:
        kwargs["dropout"] = traj.dropout
    fields = _fields(params, prepared, name, kwargs)
    if traj.kind == "ensemble":
        return _finetune_ensemble(params, name, traj, prepared, start, device, fields)
    run_seed = finetune_seed(params.seed, name)
    seed_everything(run_seed)
    model = _start_model(start, kwargs, device)
    desc = f"finetune {name}"
    if traj.kind in ("sgd", "sgld"):
        return _finetune_sgd(traj, prepared, model, device, run_seed, desc, fields)
    return _finetune_svi(traj, prepared, start, model, device, run_seed, desc, fields)


def _start_model(start: PosteriorFile, kwargs: dict[str, Any], device: torch.device) -> nn.Module:
    """The start's network (weights and buffers) built with this trajectory's kwargs."""
    model = build_model(start.model_name, start.input_shape, start.num_classes, kwargs)
    load_theta(model, start.theta, start.buffers)
    return model.to(device).train()


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


def _monitor(
    net: nn.Module,
    template: nn.Module,
    prepared: Prepared,
    train_t: Tensors,
    average: Callable[[], torch.Tensor | None] | None,
) -> Callable[[], dict[str, float]]:
    """Per-epoch test loss/accuracy of the iterate and of the running average.

    For monitoring curves only (the report says so): no choice reads them.
    ``net`` is evaluated as is (for VI: at mu); ``average()`` gives the
    running-average weights for a copy of the plain network ``template``,
    whose BatchNorm statistics are recomputed on the training data.
    """
    device = train_t.x.device
    test = tensors(prepared.test, prepared, device)
    avg_net = copy.deepcopy(template) if average is not None else None

    def metrics() -> dict[str, float]:
        loss, acc = loss_and_accuracy(net, test)
        row = {"test_loss": loss.item(), "test_accuracy": acc.item()}
        if avg_net is not None and average is not None:
            mean = average()
            row["avg_test_loss"] = row["avg_test_accuracy"] = math.nan
            if mean is not None:
                load_theta(avg_net, mean.to(device=device, dtype=torch.float32), {})
                if has_batchnorm(avg_net):
                    update_bn(avg_net, train_t.x)
                loss, acc = loss_and_accuracy(avg_net, test)
                row["avg_test_loss"], row["avg_test_accuracy"] = loss.item(), acc.item()
        return row

    return metrics


def _finetune_sgd(
    traj: Trajectory,
    prepared: Prepared,
    model: nn.Module,
    device: torch.device,
    run_seed: int,
    desc: str,
    fields: dict[str, Any],
) -> RunResult:
    """SGD or SAM (kinds sgd, ensemble), or SGLD with the same gradient steps."""
    collector: SWAG | None = None
    kept: deque[torch.Tensor] = deque(maxlen=traj.collect.max_rank if traj.collect else None)
    after_step = None
    average: Callable[[], torch.Tensor | None] | None = None
    optimizer = None
    trainable = [p for p in model.parameters() if p.requires_grad]
    if traj.kind == "sgld":
        optimizer = SGLD(trainable, len(prepared.train), weight_decay=traj.weight_decay)

        def keep() -> None:
            kept.append(parameters_to_vector(model.parameters()).detach().clone())

        after_step = _collect_schedule(traj, len(prepared.train), keep)

        def average() -> torch.Tensor | None:
            # Summed one at a time: a stacked (k, d) copy would double the samples' memory.
            return sum(kept, torch.zeros_like(kept[0])) / len(kept) if kept else None

    elif traj.collect is not None:
        collector = SWAG(sum(p.numel() for p in trainable), traj.collect.max_rank, device=device)
        swag = collector
        after_step = _collect_schedule(traj, len(prepared.train), lambda: swag.collect(model))

        def average() -> torch.Tensor | None:
            return swag.mean if swag.n_collected else None

    step = sam_step(traj.sam_rho) if traj.sam_rho > 0 else sgd_step
    train_t = tensors(prepared.train, prepared, device)
    monitor = _monitor(model, model, prepared, train_t, average)
    history = _sgd_run(
        model, traj, prepared, device, run_seed, desc, after_step, step, optimizer, monitor, train_t
    )
    posterior = PosteriorFile.from_model(model, **fields)
    if collector is not None:
        posterior.collector = collector.state_dict()
    if traj.kind == "sgld":
        if not kept:
            raise UserError(
                f"{desc}: SGLD kept no samples; lower collect.every or collect.start_epoch"
            )
        posterior.samples = {"theta": torch.stack([t.cpu() for t in kept]), "buffers": None}
    return RunResult(posterior, history)


def _finetune_ensemble(
    params: Params,
    name: str,
    traj: Trajectory,
    prepared: Prepared,
    start: PosteriorFile,
    device: torch.device,
    fields: dict[str, Any],
) -> RunResult:
    """M members, each fine-tuned from the start's pretrained member of the same index."""
    assert traj.members is not None
    available = 1 if start.samples is None else start.samples["theta"].shape[0]
    if available < traj.members:
        raise UserError(
            f"finetune.{name}: {traj.members} members need as many pretrained networks; "
            f"the start has {available} (set pretrain.members)"
        )
    runs = []
    for member in range(traj.members):
        origin = start
        if member > 0:
            assert start.samples is not None
            origin = dataclasses.replace(
                start,
                theta=start.samples["theta"][member],
                buffers=start.samples["buffers"][member],
                samples=None,
            )
        run_seed = finetune_seed(params.seed, name, member)
        seed_everything(run_seed)
        model = _start_model(origin, fields["model_kwargs"], device)
        desc = f"finetune {name} member {member + 1}/{traj.members}"
        runs.append(_finetune_sgd(traj, prepared, model, device, run_seed, desc, fields))
    posterior = runs[0].posterior
    posterior.samples = {
        "theta": torch.stack([r.posterior.theta for r in runs]),
        "buffers": [r.posterior.buffers for r in runs],
    }
    return RunResult(posterior, _mean_history([r.history for r in runs]))


def _mean_history(histories: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Per-epoch mean over ensemble members of every column (epoch and lr are shared)."""
    return [
        {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}
        for rows in zip(*histories, strict=True)
    ]


def _finetune_svi(
    traj: Trajectory,
    prepared: Prepared,
    start: PosteriorFile,
    model: nn.Module,
    device: torch.device,
    run_seed: int,
    desc: str,
    fields: dict[str, Any],
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
    average: Callable[[], torch.Tensor | None] | None = None
    if traj.kind == "hwa":
        assert traj.collect is not None
        hwa = HWA(vi.mu.numel(), traj.collect.max_rank, device=device)
        collector = hwa

        def snapshot() -> None:
            collector.collect(vi.mu, vi.rho)
            if traj.reset_to_average:
                with torch.no_grad():
                    vi.mu.copy_(collector.mu.mean)
                    vi.rho.copy_(softplus_inverse(collector.var.mean.sqrt()))

        after_step = _collect_schedule(traj, len(prepared.train), snapshot)

        def average() -> torch.Tensor | None:
            return collector.mu.mean if collector.n_collected else None

    step = svi_step(len(prepared.train), cfg.kl_weight, cfg.mc_samples, traj.sam_rho)
    train_t = tensors(prepared.train, prepared, device)
    monitor = _monitor(vi, vi.net, prepared, train_t, average)
    history = _sgd_run(
        vi, traj, prepared, device, run_seed, desc, after_step, step, None, monitor, train_t
    )
    load_theta(model, vi.mu.detach(), {})
    posterior = PosteriorFile.from_model(model, **fields)
    posterior.rho = vi.rho.detach().cpu().clone()
    if hwa is not None:
        posterior.hwa = hwa.state_dict()
    return RunResult(posterior, history)
