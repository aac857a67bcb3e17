"""Kinds that train a mean-field Gaussian (mu, rho) around the network: vi, and hwa,
which continues a vi trajectory with a cyclic rate and averages (mu, sigma) snapshots."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import Trajectory
from ..posteriors import HWA, MeanFieldVI, svi_step
from ..posteriors.file import PosteriorFile, load_theta
from ..posteriors.vi import softplus_inverse
from ..training import ieee
from ..training.distributed import broadcast
from ..training.optim import build as build_optimizer
from ..training.steps import StepContext
from ..training.train import Compute
from .run import Plan


def plan(
    traj: Trajectory,
    model: nn.Module,
    compute: Compute,
    ctx: StepContext,
    n_train: int,
    start: PosteriorFile,
) -> Plan:
    """SVI on (mu, rho) from the start's weights (vi) or its (mu, rho) (hwa)."""
    cfg = traj.vi
    assert cfg is not None
    vi = MeanFieldVI(model, cfg.sigma_init, cfg.prior_sigma).to(compute.device)
    if start.rho is not None:
        with torch.no_grad():
            vi.rho.copy_(start.rho.to(compute.device))
    optimizer = build_optimizer(
        cfg.optimizer, [vi.mu, vi.rho], momentum=traj.momentum, weight_decay=traj.weight_decay
    )
    step = svi_step(n_train, cfg.kl_weight, cfg.mc_samples, traj.sam_rho)
    out = Plan(vi, optimizer, step, template=vi.net)
    if traj.kind != "hwa":
        return out
    assert traj.collect is not None
    world = compute.world
    hwa = None
    if compute.is_main:
        hwa = out.parts["collector"] = HWA(
            vi.mu.numel(), traj.collect.max_rank, device=compute.device
        )
        out.average = lambda: hwa.mu.mean if hwa.n_collected else None

    def snapshot() -> None:
        if hwa is not None:
            hwa.collect(vi.mu, vi.rho)
        if traj.reset_to_average:
            with torch.no_grad():
                if hwa is not None:
                    vi.mu.copy_(hwa.mu.mean)
                    vi.rho.copy_(softplus_inverse(ieee.sqrt(hwa.var.mean)))
                if world is not None:  # every rank restarts from rank 0's average
                    broadcast(world, vi.mu.data)
                    broadcast(world, vi.rho.data)

    if hwa is not None or (traj.reset_to_average and world is not None):
        out.collect = snapshot
    return out


def finish(
    out: Plan, model: nn.Module, fields: dict[str, Any], start: PosteriorFile, sigma_init: float
) -> PosteriorFile:
    """The network at mu, with rho, and the HWA moments where collected."""
    vi = out.trained
    assert isinstance(vi, MeanFieldVI)
    load_theta(model, vi.mu.detach(), {})
    posterior = PosteriorFile.from_model(model, **fields)
    posterior.rho = vi.rho.detach().cpu().clone()
    # sigma at the start of the variational chain (hwa continues vi's rho): the
    # reference for how far the variances moved (the report's sigma / sigma_0).
    posterior.extra["sigma_init"] = float(start.extra.get("sigma_init", sigma_init))
    if "collector" in out.parts:
        posterior.hwa = out.parts["collector"].state_dict()
    return posterior
