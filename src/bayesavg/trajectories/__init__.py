"""Pretraining and fine-tuning runs: params + data in, posterior file out.

One module per family of trajectory kinds says what is specific to it (its
step, what it collects, its posterior): ``gradient`` (sgd, SAM, MC dropout,
sgld, ensemble members, pretraining; SGLD's optimizer is ``sgld``),
``variational`` (vi, hwa). ``run`` owns the shared loop around them:
schedule, data on the device, augmentation, precision, data parallelism,
snapshot timing, monitoring and resume; ``members`` runs several independent
members (ensembles) in sequence or across ranks.

Each run seeds its own streams from (seed, run name), so adding or
reordering trajectories never changes another one's result. Pretraining
also trains ``pretrain.members`` - 1 extra networks from their own seeds,
once for every ensemble trajectory (so F-Ensemble differs from Ensemble
only in the SAM gradient). Ensemble member 0 is the pipeline's own
pretrained network fine-tuned exactly as an sgd trajectory of the same
name would be (same seed), so an ensemble of one is that single model.
"""

from __future__ import annotations

import dataclasses
import logging
import re

import torch

from ..config import LaplaceTrajectory, Params, Trajectory
from ..data.prepared import Prepared
from ..models import build_model
from ..posteriors.file import PosteriorFile
from ..runtime.checkpoint import Resumable
from ..runtime.errors import UserError
from ..seeding import derive_seed, seed_everything
from ..training.monitoring import Monitoring
from ..training.train import Compute
from . import gradient, variational
from .common import (
    RunResult,
    compute_for,
    finetune_seed,
    posterior_fields,
    pretrain_seed,
    start_model,
    trajectory_kwargs,
)
from .from_weights import pretrain_from_weights
from .laplace_fit import fit_laplace
from .members import stacked, train_members
from .run import run_plan, step_context

__all__ = [
    "RunResult",
    "compute_for",
    "finetune",
    "initial_network",
    "posterior_fields",
    "pretrain",
    "pretrain_members",
    "start_model",
    "trajectory_kwargs",
]

log = logging.getLogger(__name__)


def _compute(params: Params, device: torch.device, compute: Compute | None) -> Compute:
    return compute if compute is not None else compute_for(params, device)


def monitoring(params: Params) -> Monitoring:
    """The params' curve settings; one subset per pipeline seed, shared by every run."""
    m = params.monitor
    return Monitoring(m.every, m.fraction, derive_seed(params.seed, "monitor"))


def pretrain_members(
    params: Params,
    prepared: Prepared,
    device: torch.device,
    resume: Resumable | None = None,
    compute: Compute | None = None,
) -> RunResult | None:
    """Member 0 (the pipeline's network), with all ``pretrain.members`` in ``samples``.

    The history is member 0's: extra members only feed ensembles. Under N
    processes the members are spread across ranks; rank 0 gets the result,
    the others None.
    """
    compute = _compute(params, device, compute)
    solo = dataclasses.replace(compute, world=None)
    runs = train_members(
        params.pretrain.members,
        lambda member, nested: pretrain(params, prepared, device, member, nested, solo),
        resume,
        compute.world,
    )
    if runs is None:
        return None
    posterior = runs[0].posterior
    if len(runs) > 1:
        posterior.samples = stacked(runs)
    return RunResult(posterior, runs[0].history)


def initial_network(params: Params, prepared: Prepared) -> PosteriorFile:
    """A fresh network seeded by (seed, "init"), built on the CPU so that it is the same on
    every device: the start of trajectories that train from scratch (distributed SWAG)."""
    seed_everything(derive_seed(params.seed, "init"), torch.device("cpu"))
    kwargs = params.model.kwargs()
    model = build_model(
        params.model.model_name(), prepared.input_shape, prepared.num_classes, kwargs
    )
    return PosteriorFile.from_model(model, **posterior_fields(params, prepared, "init", kwargs))


def pretrain(
    params: Params,
    prepared: Prepared,
    device: torch.device,
    member: int = 0,
    resume: Resumable | None = None,
    compute: Compute | None = None,
) -> RunResult:
    """Deterministic SGD from a seeded initialisation (``member`` > 0: an ensemble member's)."""
    compute = _compute(params, device, compute)
    if params.pretrain.kind == "weights":
        return pretrain_from_weights(
            params, prepared, device, member, resume, compute, monitoring(params)
        )
    run_seed = pretrain_seed(params.seed, member)
    seed_everything(run_seed, device)
    kwargs = params.model.kwargs()
    model = build_model(
        params.model.model_name(), prepared.input_shape, prepared.num_classes, kwargs
    )
    model = compute.prepare(model)
    ctx = step_context(compute, run_seed)
    desc = "pretrain" if member == 0 else f"pretrain member {member}"
    opts = params.pretrain
    plan = gradient.plan(opts, model, compute, ctx, len(prepared.train))
    history = run_plan(
        plan,
        opts,
        prepared,
        compute,
        ctx,
        run_seed,
        desc,
        monitoring=monitoring(params),
        resume=resume,
    )
    fields = posterior_fields(params, prepared, "pretrain", kwargs)
    return RunResult(gradient.finish(plan, fields, desc), history)


def finetune(
    params: Params,
    name: str,
    prepared: Prepared,
    start: PosteriorFile,
    device: torch.device,
    resume: Resumable | None = None,
    compute: Compute | None = None,
) -> RunResult | None:
    """Continue from ``start`` along trajectory ``name`` (SGD/SAM, SGLD, ensemble, VI or HWA),
    or fit its last-layer Laplace (``laplace``); distributed SWAG is
    ``dswag.rounds.finetune_dswag``.

    ``resume``: a checkpoint to continue from and save to (see ``checkpoint``);
    ``compute``: precision, layout, augmentation and the ranks of a
    data-parallel run (default: the params' on one process). Rank 0 returns
    the result, the other ranks None.
    """
    traj = params.finetune[name]
    if isinstance(traj, LaplaceTrajectory):
        return fit_laplace(params, name, prepared, start, device)
    if not isinstance(traj, Trajectory):
        raise TypeError(f"finetune.{name}: a {traj.kind} trajectory runs in bayesavg.dswag.rounds")
    compute = _compute(params, device, compute)
    kwargs = trajectory_kwargs(start, traj.dropout)
    fields = posterior_fields(params, prepared, name, kwargs)
    if traj.kind == "ensemble":
        return _ensemble(params, name, traj, prepared, start, compute, fields, resume)
    result = _run(params, name, traj, prepared, start, compute, fields, resume)
    if result is not None and traj.provides() & {"snapshots", "hwa"}:
        result.posterior.start_theta = start.theta.clone()
    return result


def _run(
    params: Params,
    name: str,
    traj: Trajectory,
    prepared: Prepared,
    start: PosteriorFile,
    compute: Compute,
    fields: dict,
    resume: Resumable | None,
    member: int = 0,
) -> RunResult | None:
    """One trajectory run from ``start``'s weights: its kind's plan through the shared loop."""
    run_seed = finetune_seed(params.seed, name, member)
    seed_everything(run_seed, compute.device)
    model = compute.prepare(start_model(start, fields["model_kwargs"], compute.device))
    covers = scope(traj, model, name)
    ctx = step_context(compute, run_seed)
    desc = f"finetune {name}"
    if traj.kind == "ensemble":
        desc += f" member {member + 1}/{traj.members}"
    n_train = len(prepared.train)
    if traj.kind in ("vi", "hwa"):
        plan = variational.plan(traj, model, compute, ctx, n_train, start)
    else:
        plan = gradient.plan(traj, model, compute, ctx, n_train, covers)
    history = run_plan(
        plan,
        traj,
        prepared,
        compute,
        ctx,
        run_seed,
        desc,
        snapshots=traj,
        monitor=True,
        monitoring=monitoring(params),
        resume=resume,
    )
    if not compute.is_main:
        return None
    if traj.kind in ("vi", "hwa"):
        assert traj.vi is not None
        posterior = variational.finish(plan, model, fields, start, traj.vi.sigma_init)
    else:
        posterior = gradient.finish(plan, fields, desc)
    posterior.covers = covers
    return RunResult(posterior, history)


def scope(traj: Trajectory, model: torch.nn.Module, name: str) -> list[str] | None:
    """The names of the parameters ``traj``'s posterior covers (None: all); with
    ``rest: frozen`` the others stop training (``requires_grad`` off)."""
    if traj.posterior is None:
        return None
    pattern = re.compile(traj.posterior.params)
    names = [n for n, _ in model.named_parameters() if pattern.search(n)]
    if not names:
        first = [n for n, _ in model.named_parameters()][:4]
        raise UserError(
            f"finetune.{name}.posterior.params: {traj.posterior.params!r} matches no parameter "
            f"of the network (they are named like {', '.join(first)}, ...)"
        )
    if traj.posterior.rest == "frozen":
        for n, param in model.named_parameters():
            param.requires_grad_(n in names)
    return names


def _ensemble(
    params: Params,
    name: str,
    traj: Trajectory,
    prepared: Prepared,
    start: PosteriorFile,
    compute: Compute,
    fields: dict,
    resume: Resumable | None,
) -> RunResult | None:
    """M members, each fine-tuned from the start's pretrained member of the same index."""
    assert traj.members is not None
    available = 1 if start.samples is None else start.samples["theta"].shape[0]
    if available < traj.members:
        raise UserError(
            f"finetune.{name}: {traj.members} members need as many pretrained networks; "
            f"the start has {available} (set pretrain.members)"
        )
    solo = dataclasses.replace(compute, world=None)

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
        result = _run(params, name, traj, prepared, origin, solo, fields, nested, member)
        assert result is not None
        return result

    runs = train_members(traj.members, member_run, resume, compute.world)
    if runs is None:
        return None
    posterior = dataclasses.replace(runs[0].posterior, collector=None)
    posterior.samples = stacked(runs)
    return RunResult(posterior, _mean_history([r.history for r in runs]))


def _mean_history(histories: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Per-epoch mean over ensemble members of every column (epoch and lr are shared)."""
    return [
        {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}
        for rows in zip(*histories, strict=True)
    ]
