"""Kinds that step the network's own weights: sgd (SWAG snapshots with ``collect``, SAM
with ``sam_rho``, MC dropout with ``dropout``), the same for pretraining and ensemble
members, and sgld (Langevin noise after each step, keeping the last samples)."""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from torch import nn

from ..config import PretrainParams, Trajectory
from ..posteriors import SWAG
from ..posteriors.file import PosteriorFile, covered_positions
from ..runtime.errors import UserError
from ..training.flat import params_vector
from ..training.sam import sam_step
from ..training.steps import StepContext, sgd, sgd_step
from ..training.train import Compute
from .run import Plan
from .sgld import SGLD


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


def plan(
    opts: PretrainParams | Trajectory,
    model: nn.Module,
    compute: Compute,
    ctx: StepContext,
    n_train: int,
    covers: list[str] | None = None,
) -> Plan:
    """SGD (or SAM) on ``model``'s trainable parameters; SWAG snapshots where ``opts``
    collects, of the parameters ``covers`` names (None: all); SGLD for kind sgld."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    rho = getattr(opts, "sam_rho", 0.0)
    out = Plan(model, sgd(trainable, opts.momentum, opts.weight_decay))
    out.step = sam_step(rho) if rho > 0 else sgd_step
    collect = getattr(opts, "collect", None)
    if getattr(opts, "kind", "sgd") == "sgld":
        assert collect is not None
        out.optimizer = SGLD(trainable, n_train, weight_decay=opts.weight_decay)
        out.optimizer.generator = ctx.shared
        if compute.is_main:
            kept = out.parts["kept"] = KeptSamples(collect.max_rank, compute.device)
            out.collect = lambda: kept.append(params_vector(trainable))
            out.average = kept.mean
    elif collect is not None and compute.is_main:
        named = dict(model.named_parameters())
        covered = [named[n] for n in covers] if covers is not None else list(named.values())
        swag = out.parts["collector"] = SWAG(
            sum(p.numel() for p in covered), collect.max_rank, device=compute.device
        )
        out.collect = lambda: swag.collect(params_vector(covered))
        if covers is None:
            out.average = lambda: swag.mean if swag.n_collected else None
        else:
            index = covered_positions(model, covers, compute.device)

            def average() -> torch.Tensor | None:
                """The running average of the covered weights, the rest as they are now."""
                if not swag.n_collected:
                    return None
                whole = params_vector(model.parameters()).detach().clone()
                return whole.index_copy_(0, index, swag.mean.to(whole.dtype))

            out.average = average
    return out


def finish(out: Plan, fields: dict[str, Any], desc: str) -> PosteriorFile:
    """The posterior file of a finished run: final weights, and what it collected."""
    posterior = PosteriorFile.from_model(out.trained, **fields)
    if "collector" in out.parts:
        posterior.collector = out.parts["collector"].state_dict()
    if "kept" in out.parts:
        if not out.parts["kept"].items:
            raise UserError(
                f"{desc}: SGLD kept no samples; lower collect.every or collect.start_epoch"
            )
        posterior.samples = {"theta": out.parts["kept"].stacked(), "buffers": None}
    return posterior
