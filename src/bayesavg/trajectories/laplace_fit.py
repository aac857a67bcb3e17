"""The laplace trajectory: a last-layer KFAC Laplace at the start's final weights.

Nothing trains. The start's network is fitted by laplace-torch over the
training split in fixed batches (``posteriors.last_layer_laplace.fit_last_layer``); the
posterior file keeps the start's weights and buffers and adds the factors as
tensors, so predicting never needs the library.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import LaplaceTrajectory, Params
from ..data.prepared import Prepared
from ..models import head_name
from ..posteriors.file import PosteriorFile
from ..posteriors.laplace_predictive import probit_log_probs
from ..posteriors.last_layer_laplace import (
    LastLayerLaplace,
    LazyBatches,
    fit_last_layer,
    last_layer_name,
)
from ..runtime.errors import UserError
from ..seeding import derive_seed, seed_everything
from ..training.batches import Tensors
from .common import RunResult, posterior_fields, start_model, trajectory_kwargs


def check_last_layer(model: nn.Module, start: PosteriorFile, name: str) -> None:
    """The layer a last-layer Laplace treats (the last ``nn.Linear``) must be the head
    whose outputs are the logits, else its predictive would be another network's."""
    head = head_name(model, start.num_classes)
    try:
        layer = last_layer_name(model)
    except ValueError:
        layer = None
    if layer is None or layer != head:
        net = start.model_name
        if head is None:
            found = f"{net} has no layer with {start.num_classes} outputs"
        else:
            found = f"{net}'s head is {head!r}, a {type(model.get_submodule(head)).__name__}"
        found += ", and no nn.Linear" if layer is None else f", its last nn.Linear {layer!r}"
        raise UserError(
            f"finetune.{name}: a last-layer Laplace treats the last nn.Linear, which must be "
            f"the head (the {start.num_classes} logits); {found}: choose another network "
            "or method"
        )


def fit_laplace(
    params: Params, name: str, prepared: Prepared, start: PosteriorFile, device: torch.device
) -> RunResult:
    """The start's network with its last-layer Laplace posterior; the history is one row:
    the predictive's validation NLL and accuracy, and the prior precision laplace-torch
    found."""
    traj = params.finetune[name]
    if not isinstance(traj, LaplaceTrajectory):
        raise TypeError(f"finetune.{name}: kind {traj.kind} is not a Laplace approximation")
    seed_everything(derive_seed(params.seed, "finetune", name), device)
    kwargs = trajectory_kwargs(start, None)
    model = start_model(start, kwargs, device).eval()
    check_last_layer(model, start, name)
    x, y = prepared.train.x, prepared.train.y
    batches = LazyBatches(
        len(x),
        traj.batch_size,
        lambda i, j: (start.model_input(x[i:j], device), y[i:j].to(device)),
    )
    state = fit_last_layer(model, batches, prior=traj.prior_precision)
    fields = posterior_fields(params, prepared, name, kwargs)
    posterior = PosteriorFile(
        theta=start.theta.clone(),
        buffers={k: v.clone() for k, v in start.buffers.items()},
        laplace=state,
        **fields,
    )
    val = Tensors(start.inputs(prepared.val.x, device), prepared.val.y.to(device))
    row = {"epoch": 0.0, **_validation(model, state, val)}
    row["prior_precision"] = float(state["prior_precision"].reshape(-1)[0])
    return RunResult(posterior, [row])


def _validation(model: nn.Module, state: dict, val: Tensors) -> dict[str, float]:
    """The probit predictive's validation NLL and accuracy, as the evaluate stage computes
    them, so the run has the ``val_loss`` every trajectory's curve is plotted by."""
    la = LastLayerLaplace.from_state_dict(state, val.y.device)
    log_probs = probit_log_probs(la, model, state["layer"], val.x, 1000)
    nll = -log_probs.gather(1, val.y[:, None]).mean()
    accuracy = (log_probs.argmax(1) == val.y).double().mean()
    return {"val_loss": nll.item(), "val_accuracy": accuracy.item()}
