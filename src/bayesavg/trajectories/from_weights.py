"""``pretrain.kind: weights``: the network starts from given weights with a new,
seeded classification head; the only training is an optional fit of that head
(``pretrain.head_epochs``), the rest frozen in eval mode (its BatchNorm statistics and
dropout as the weights had them), a linear probe before fine-tuning.

Members (``pretrain.members``) share the weights and differ by their head's
initialisation and, with a head fit, by their data order: what deep ensembles of a
pretrained network are in the literature.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
from torch import nn

from ..config import Params
from ..data.prepared import Prepared
from ..models import build_model, head_name
from ..models.weights import fetch, load_into, read_state
from ..posteriors.file import PosteriorFile
from ..runtime.checkpoint import Resumable
from ..runtime.errors import UserError
from ..seeding import seed_everything
from ..training.monitoring import Monitoring
from ..training.train import Compute, loss_and_accuracy
from . import gradient
from .common import RunResult, posterior_fields, pretrain_seed, watched
from .run import run_plan, step_context


def _stay_eval(self: nn.Module, mode: bool = True) -> nn.Module:
    self.training = False
    return self


@contextlib.contextmanager
def frozen_except(model: nn.Module, head: str) -> Iterator[None]:
    """Only ``head``'s parameters train; every module outside it stays in eval mode
    whatever ``model.train()`` asks (its ``train`` replaced on the instance, put back
    after)."""
    inside = (head, f"{head}.")
    kept = [p for name, p in model.named_parameters() if not name.startswith(inside)]
    pinned = [
        m
        for name, m in model.named_modules()
        if name and not name.startswith(inside) and not head.startswith(f"{name}.")
    ]
    modes = [m.training for m in pinned]
    for p in kept:
        p.requires_grad_(False)
    for m in pinned:
        m.train = types.MethodType(_stay_eval, m)  # type: ignore[method-assign]
        m.training = False
    try:
        yield
    finally:
        for p in kept:
            p.requires_grad_(True)
        for m, mode in zip(pinned, modes, strict=True):
            del m.train
            m.training = mode


def pretrain_from_weights(
    params: Params,
    prepared: Prepared,
    device: torch.device,
    member: int,
    resume: Resumable | None,
    compute: Compute,
    monitoring: Monitoring,
) -> RunResult:
    """Member ``member``: the weights, a head from the member's seed, the head fit."""
    assert params.model.weights is not None
    run_seed = pretrain_seed(params.seed, member)
    seed_everything(run_seed, device)
    kwargs = params.model.kwargs()
    name = params.model.model_name()
    model = build_model(name, prepared.input_shape, prepared.num_classes, kwargs)
    head = head_name(model, prepared.num_classes)
    path = fetch(params.model.weights, params.data.raw_dir)
    load_into(model, read_state(path), head, path)
    model = compute.prepare(model)
    fields = posterior_fields(params, prepared, "pretrain", kwargs)
    desc = "pretrain (head fit)" if member == 0 else f"pretrain member {member} (head fit)"
    opts = params.pretrain
    if opts.head_epochs == 0:
        loss, acc = loss_and_accuracy(
            model, watched(prepared.val, prepared, device), precision=compute.precision
        )
        row = {"epoch": 0.0, "val_loss": loss.item(), "val_accuracy": acc.item()}
        return RunResult(PosteriorFile.from_model(model, **fields), [row])
    if head is None:
        raise UserError(
            f"pretrain.head_epochs: {name} has no classification head (a last nn.Linear with "
            f"{prepared.num_classes} outputs) to fit; set head_epochs: 0"
        )
    fit = opts.model_copy(update={"epochs": opts.head_epochs})
    ctx = step_context(compute, run_seed)
    with frozen_except(model, head):
        plan = gradient.plan(fit, model, compute, ctx, len(prepared.train))
        history = run_plan(
            plan, fit, prepared, compute, ctx, run_seed, desc, monitoring=monitoring, resume=resume
        )
    return RunResult(gradient.finish(plan, fields, desc), history)
