"""The laplace trajectory: a last-layer KFAC Laplace at the start's final weights.

Nothing trains. The start's network is fitted by laplace-torch over the
training split in fixed batches (``posteriors.last_layer_laplace.fit_last_layer``); the
posterior file keeps the start's weights and buffers and adds the factors as
tensors, so predicting never needs the library.
"""

from __future__ import annotations

import torch

from ..config import LaplaceTrajectory, Params
from ..data.prepared import Prepared
from ..posteriors.file import PosteriorFile
from ..posteriors.last_layer_laplace import fit_last_layer
from ..seeding import derive_seed, seed_everything
from .common import RunResult, posterior_fields, start_model, trajectory_kwargs


def fit_laplace(
    params: Params, name: str, prepared: Prepared, start: PosteriorFile, device: torch.device
) -> RunResult:
    """The start's network with its last-layer Laplace posterior; the history is one row:
    the prior precision and the log marginal likelihood's parts laplace-torch found."""
    traj = params.finetune[name]
    if not isinstance(traj, LaplaceTrajectory):
        raise TypeError(f"finetune.{name}: kind {traj.kind} is not a Laplace approximation")
    seed_everything(derive_seed(params.seed, "finetune", name), device)
    kwargs = trajectory_kwargs(start, None)
    model = start_model(start, kwargs, device).eval()
    x = prepared.train.x
    batches = [
        (
            start.model_input(x[i : i + traj.batch_size], device),
            prepared.train.y[i : i + traj.batch_size].to(device),
        )
        for i in range(0, len(x), traj.batch_size)
    ]
    state = fit_last_layer(model, batches, prior=traj.prior_precision)
    fields = posterior_fields(params, prepared, name, kwargs)
    posterior = PosteriorFile(
        theta=start.theta.clone(),
        buffers={k: v.clone() for k, v in start.buffers.items()},
        laplace=state,
        **fields,
    )
    row = {"epoch": 0.0, "prior_precision": float(state["prior_precision"].reshape(-1)[0])}
    return RunResult(posterior, [row])
