"""Pretraining and fine-tuning runs: params + data in, posterior file out.

Each run seeds its own streams from (seed, run name), so adding or
reordering trajectories never changes another one's result. Pretraining
also trains ``pretrain.members`` - 1 extra networks from their own seeds,
once for every ensemble trajectory (so F-Ensemble differs from Ensemble
only in the SAM gradient). Ensemble member 0 is the pipeline's own
pretrained network fine-tuned exactly as an sgd trajectory of the same
name would be (same seed), so an ensemble of one is that single model.

Every run can be resumed. Everything it changes while it trains (network,
optimizer, collector or kept samples, shuffling generator, torch's RNG
streams, iteration and history) is one state tree (``_Run.state_dict``)
that a ``Checkpoint`` saves at epoch boundaries; loading that tree and
training on gives, on CPU, the bytes an uninterrupted run gives.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from .batchnorm import bn_modules, update_bn
from .checkpoint import Resumable
from .config import Params, PretrainParams, Trajectory
from .data import Prepared, Split, to_input
from .errors import UserError
from .models import build_model, has_batchnorm
from .optim import Optimizer
from .optim import build as build_optimizer
from .posterior_file import PosteriorFile, load_theta
from .posteriors import HWA, SWAG, MeanFieldVI, svi_step
from .posteriors.vi import softplus_inverse
from .sam import sam_step
from .seeding import derive_seed, generator, rng_state, seed_everything, set_rng_state
from .sgld import SGLD
from .train import (
    Progress,
    Step,
    Tensors,
    batches_per_epoch,
    loss_and_accuracy,
    lr_at,
    sgd,
    sgd_step,
    train,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    posterior: PosteriorFile
    history: list[dict[str, float]]

    def state_dict(self) -> dict[str, Any]:
        """A finished run (an ensemble member) as plain values, for its ensemble's checkpoint."""
        return {"posterior": self.posterior.to_dict(), "history": self.history}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> RunResult:
        return cls(PosteriorFile.from_dict(state["posterior"]), list(state["history"]))


def tensors(split: Split, prepared: Prepared, device: torch.device) -> Tensors:
    m = prepared.manifest
    return Tensors(to_input(split.x, m["mean"], m["std"], device), split.y.to(device))


def pretrain_seed(seed: int, member: int = 0) -> int:
    """Pretraining seed; member > 0 are the extra ensemble members."""
    return derive_seed(seed, "pretrain") if member == 0 else derive_seed(seed, "pretrain", member)


def finetune_seed(seed: int, name: str, member: int = 0) -> int:
    base = ("finetune", name) if member == 0 else ("finetune", name, member)
    return derive_seed(seed, *base)


def trajectory_kwargs(start: PosteriorFile, dropout: float | None) -> dict[str, Any]:
    """The start's model kwargs, with the trajectory's own dropout rate where it sets one."""
    kwargs = dict(start.model_kwargs)
    if dropout is not None:
        kwargs["dropout"] = dropout
    return kwargs


def posterior_fields(
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


class KeptSamples:
    """The last ``max_len`` weight vectors of a chain (SGLD), on the training device."""

    def __init__(self, max_len: int, device: torch.device) -> None:
        self.items: deque[torch.Tensor] = deque(maxlen=max_len)
        self.device = device

    def append(self, theta: torch.Tensor) -> None:
        self.items.append(theta.detach().clone())

    def mean(self) -> torch.Tensor | None:
        # Summed one at a time: a stacked (k, d) copy would double the samples' memory.
        if not self.items:
            return None
        return sum(self.items, torch.zeros_like(self.items[0])) / len(self.items)

    def stacked(self) -> torch.Tensor:
        """(k, d) on the CPU, oldest first."""
        return torch.stack([t.cpu() for t in self.items])

    def state_dict(self) -> dict[str, Any]:
        return {"theta": [t.cpu() for t in self.items]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.items.clear()
        self.items.extend(t.to(self.device) for t in state["theta"])


class _Run:
    """One training run's mutable state as a single tree: ``parts`` (objects with
    ``state_dict``/``load_state_dict``: network, optimizer, collector), the
    shuffling generator, torch's RNG streams and the loop's progress."""

    def __init__(self, parts: dict[str, Any], shuffle: torch.Generator, device: torch.device):
        self.parts = parts
        self.shuffle = shuffle
        self.device = device
        self.progress = Progress()

    def state_dict(self) -> dict[str, Any]:
        return {
            "parts": {name: part.state_dict() for name, part in self.parts.items()},
            "shuffle": self.shuffle.get_state(),
            "rng": rng_state(self.device),
            "progress": self.progress.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, part in self.parts.items():
            part.load_state_dict(state["parts"][name])
        self.shuffle.set_state(state["shuffle"])
        set_rng_state(state["rng"], self.device)
        self.progress = Progress.from_state_dict(state["progress"])


def _train(
    net: nn.Module,
    opts: PretrainParams | Trajectory,
    prepared: Prepared,
    device: torch.device,
    run_seed: int,
    desc: str,
    *,
    optimizer: Optimizer,
    parts: dict[str, Any] | None = None,
    step: Step = sgd_step,
    after_step: Callable[[int], None] | None = None,
    epoch_metrics: Callable[[], dict[str, float]] | None = None,
    train_t: Tensors | None = None,
    resume: Resumable | None = None,
) -> list[dict[str, float]]:
    """Train ``net`` with ``optimizer`` on ``opts``' schedule, resumable through ``resume``.

    ``parts``: what else the run changes (a collector, kept samples), saved
    with it. ``train_t``: the training tensors if the caller already holds
    them on ``device``.
    """
    if train_t is None:
        train_t = tensors(prepared.train, prepared, device)
    total = opts.epochs * batches_per_epoch(len(train_t), opts.batch_size, bool(bn_modules(net)))
    s = opts.schedule
    run = _Run({"net": net, "optimizer": optimizer, **(parts or {})}, generator(run_seed), device)
    if resume is not None and resume.state is not None:
        run.load_state_dict(resume.state)
        log.info("%s: resuming from the checkpoint after epoch %d", desc, run.progress.epoch)

    def on_epoch(progress: Progress) -> None:
        if resume is not None and resume.due(progress.epoch):
            resume.save(run.state_dict())

    return train(
        net,
        optimizer,
        train_t,
        step=step,
        epochs=opts.epochs,
        batch_size=opts.batch_size,
        lr=lr_at(s.kind, s.lr, s.lr_end, s.cycle_length, total),
        generator=run.shuffle,
        val_data=tensors(prepared.val, prepared, device),
        after_step=after_step,
        epoch_metrics=epoch_metrics,
        desc=desc,
        progress=run.progress,
        on_epoch=on_epoch,
    )


def _members(
    count: int,
    train_member: Callable[[int, Resumable | None], RunResult],
    resume: Resumable | None,
) -> list[RunResult]:
    """Train members 0..count-1 one after another, resumable across and within members.

    The checkpoint holds the finished members and the state of the one in
    training (``{"member", "done", "run"}``).
    """
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
        if resume is not None and resume.active:
            finished = [r.state_dict() for r in done]
            resume.save({"member": member + 1, "done": finished, "run": None})
    return done


def pretrain_members(
    params: Params, prepared: Prepared, device: torch.device, resume: Resumable | None = None
) -> RunResult:
    """Member 0 (the pipeline's network), with all ``pretrain.members`` in ``samples``.

    The history is member 0's: extra members only feed ensembles.
    """
    runs = _members(
        params.pretrain.members,
        lambda member, nested: pretrain(params, prepared, device, member, nested),
        resume,
    )
    posterior = runs[0].posterior
    if len(runs) > 1:
        posterior.samples = {
            "theta": torch.stack([r.posterior.theta for r in runs]),
            "buffers": [r.posterior.buffers for r in runs],
        }
    return RunResult(posterior, runs[0].history)


def initial_network(params: Params, prepared: Prepared) -> PosteriorFile:
    """A fresh network seeded by (seed, "init"), built on the CPU so that it is the same on
    every device: the start of trajectories that train from scratch (distributed SWAG)."""
    seed_everything(derive_seed(params.seed, "init"), torch.device("cpu"))
    kwargs = params.model.kwargs()
    model = build_model(params.model.name, prepared.input_shape, prepared.num_classes, kwargs)
    return PosteriorFile.from_model(model, **posterior_fields(params, prepared, "init", kwargs))


def pretrain(
    params: Params,
    prepared: Prepared,
    device: torch.device,
    member: int = 0,
    resume: Resumable | None = None,
) -> RunResult:
    """Deterministic SGD from a seeded initialisation (``member`` > 0: an ensemble member's)."""
    run_seed = pretrain_seed(params.seed, member)
    seed_everything(run_seed, device)
    kwargs = params.model.kwargs()
    model = build_model(params.model.name, prepared.input_shape, prepared.num_classes, kwargs).to(
        device
    )
    desc = "pretrain" if member == 0 else f"pretrain member {member}"
    opts = params.pretrain
    optimizer = sgd(model, opts.momentum, opts.weight_decay)
    history = _train(
        model, opts, prepared, device, run_seed, desc, optimizer=optimizer, resume=resume
    )
    fields = posterior_fields(params, prepared, "pretrain", kwargs)
    posterior = PosteriorFile.from_model(model, **fields)
    return RunResult(posterior, history)


def finetune(
    params: Params,
    name: str,
    prepared: Prepared,
    start: PosteriorFile,
    device: torch.device,
    resume: Resumable | None = None,
) -> RunResult:
    """Continue from ``start`` along trajectory ``name`` (SGD/SAM, SGLD, ensemble, VI or HWA;
    distributed SWAG is ``dswag.finetune_dswag``).

    ``resume``: a checkpoint to continue from and save to (see ``checkpoint``).
    """
    traj = params.finetune[name]
    if not isinstance(traj, Trajectory):
        raise TypeError(f"finetune.{name}: a {traj.kind} trajectory runs in bayesavg.dswag")
    kwargs = trajectory_kwargs(start, traj.dropout)
    fields = posterior_fields(params, prepared, name, kwargs)
    if traj.kind == "ensemble":
        return _finetune_ensemble(params, name, traj, prepared, start, device, fields, resume)
    run_seed = finetune_seed(params.seed, name)
    seed_everything(run_seed, device)
    model = start_model(start, kwargs, device)
    desc = f"finetune {name}"
    if traj.kind in ("sgd", "sgld"):
        result = _finetune_sgd(traj, prepared, model, device, run_seed, desc, fields, resume)
    else:
        result = _finetune_svi(traj, prepared, start, model, device, run_seed, desc, fields, resume)
    if traj.provides() & {"snapshots", "hwa"}:
        result.posterior.start_theta = start.theta.clone()
    return result


def start_model(start: PosteriorFile, kwargs: dict[str, Any], device: torch.device) -> nn.Module:
    """The start's network (weights and buffers) built with this trajectory's kwargs."""
    model = build_model(start.model_name, start.input_shape, start.num_classes, kwargs)
    load_theta(model, start.theta, start.buffers)
    return model.to(device).train()


def _collect_schedule(
    traj: Trajectory, n_train: int, net: nn.Module, collect: Callable[[], None]
) -> Callable[[int], None]:
    """``after_step`` that calls ``collect`` at the trajectory's snapshot iterations
    (``net``: the network trained, whose BatchNorm layers can change the batch count)."""
    per_epoch = batches_per_epoch(n_train, traj.batch_size, bool(bn_modules(net)))

    def after_step(i: int) -> None:
        if traj.collects_after(i, per_epoch):
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
    resume: Resumable | None,
) -> RunResult:
    """SGD or SAM (kinds sgd, ensemble), or SGLD with the same gradient steps."""
    parts: dict[str, Any] = {}
    after_step = None
    average: Callable[[], torch.Tensor | None] | None = None
    trainable = [p for p in model.parameters() if p.requires_grad]
    if traj.kind == "sgld":
        assert traj.collect is not None
        optimizer: Optimizer = SGLD(trainable, len(prepared.train), weight_decay=traj.weight_decay)
        kept = parts["kept"] = KeptSamples(traj.collect.max_rank, device)
        after_step = _collect_schedule(
            traj, len(prepared.train), model, lambda: kept.append(parameters_to_vector(trainable))
        )
        average = kept.mean
    else:
        optimizer = sgd(trainable, traj.momentum, traj.weight_decay)
        if traj.collect is not None:
            swag = parts["collector"] = SWAG(
                sum(p.numel() for p in trainable), traj.collect.max_rank, device=device
            )
            after_step = _collect_schedule(
                traj, len(prepared.train), model, lambda: swag.collect(model)
            )

            def average() -> torch.Tensor | None:
                return swag.mean if swag.n_collected else None

    step = sam_step(traj.sam_rho) if traj.sam_rho > 0 else sgd_step
    train_t = tensors(prepared.train, prepared, device)
    history = _train(
        model,
        traj,
        prepared,
        device,
        run_seed,
        desc,
        optimizer=optimizer,
        parts=parts,
        step=step,
        after_step=after_step,
        epoch_metrics=_monitor(model, model, prepared, train_t, average),
        train_t=train_t,
        resume=resume,
    )
    posterior = PosteriorFile.from_model(model, **fields)
    if "collector" in parts:
        posterior.collector = parts["collector"].state_dict()
    if "kept" in parts:
        if not parts["kept"].items:
            raise UserError(
                f"{desc}: SGLD kept no samples; lower collect.every or collect.start_epoch"
            )
        posterior.samples = {"theta": parts["kept"].stacked(), "buffers": None}
    return RunResult(posterior, history)


def _finetune_ensemble(
    params: Params,
    name: str,
    traj: Trajectory,
    prepared: Prepared,
    start: PosteriorFile,
    device: torch.device,
    fields: dict[str, Any],
    resume: Resumable | None,
) -> RunResult:
    """M members, each fine-tuned from the start's pretrained member of the same index."""
    assert traj.members is not None
    available = 1 if start.samples is None else start.samples["theta"].shape[0]
    if available < traj.members:
        raise UserError(
            f"finetune.{name}: {traj.members} members need as many pretrained networks; "
            f"the start has {available} (set pretrain.members)"
        )

    def member_run(member: int, nested: Resumable | None) -> RunResult:
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
        seed_everything(run_seed, device)
        model = start_model(origin, fields["model_kwargs"], device)
        desc = f"finetune {name} member {member + 1}/{traj.members}"
        return _finetune_sgd(traj, prepared, model, device, run_seed, desc, fields, nested)

    runs = _members(traj.members, member_run, resume)
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
    resume: Resumable | None,
) -> RunResult:
    """SVI on (mu, rho) from the start's weights (vi) or its (mu, rho) (hwa)."""
    cfg = traj.vi
    assert cfg is not None
    vi = MeanFieldVI(model, cfg.sigma_init, cfg.prior_sigma).to(device)
    if start.rho is not None:
        with torch.no_grad():
            vi.rho.copy_(start.rho.to(device))
    parts: dict[str, Any] = {}
    after_step = None
    average: Callable[[], torch.Tensor | None] | None = None
    if traj.kind == "hwa":
        assert traj.collect is not None
        hwa = parts["collector"] = HWA(vi.mu.numel(), traj.collect.max_rank, device=device)

        def snapshot() -> None:
            hwa.collect(vi.mu, vi.rho)
            if traj.reset_to_average:
                with torch.no_grad():
                    vi.mu.copy_(hwa.mu.mean)
                    vi.rho.copy_(softplus_inverse(hwa.var.mean.sqrt()))

        after_step = _collect_schedule(traj, len(prepared.train), model, snapshot)

        def average() -> torch.Tensor | None:
            return hwa.mu.mean if hwa.n_collected else None

    train_t = tensors(prepared.train, prepared, device)
    history = _train(
        vi,
        traj,
        prepared,
        device,
        run_seed,
        desc,
        optimizer=build_optimizer(
            cfg.optimizer, [vi.mu, vi.rho], momentum=traj.momentum, weight_decay=traj.weight_decay
        ),
        parts=parts,
        step=svi_step(len(prepared.train), cfg.kl_weight, cfg.mc_samples, traj.sam_rho),
        after_step=after_step,
        epoch_metrics=_monitor(vi, vi.net, prepared, train_t, average),
        train_t=train_t,
        resume=resume,
    )
    load_theta(model, vi.mu.detach(), {})
    posterior = PosteriorFile.from_model(model, **fields)
    posterior.rho = vi.rho.detach().cpu().clone()
    # sigma at the start of the variational chain (hwa continues vi's rho): the
    # reference for how far the variances moved (the report's sigma / sigma_0).
    posterior.extra["sigma_init"] = float(start.extra.get("sigma_init", cfg.sigma_init))
    if "collector" in parts:
        posterior.hwa = parts["collector"].state_dict()
    return RunResult(posterior, history)
