"""What the DSWAG worker sweep measures (the DSWAG paper's figures 5-7, ALGORITHMS §8).

``rounds_to_target``: the phase-1 round whose global model first reaches the
target train accuracy. ``sigma_distance``: test accuracy of the single
network theta_bar + m * sigma * z, z ~ N(0, I), for each multiple m and
several seeded z (Fig. 6): how far along the SWAG diagonal the solution
stays good. The same z are used for every m, so the curves are smooth in m
and comparable across W.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..data.inputs import Input
from ..evaluation.evaluate import log_softmax_predictions
from ..models import for_inference, has_batchnorm
from ..posteriors import SWAG
from ..posteriors.file import PosteriorFile, load_theta
from ..training import ieee
from ..training.batchnorm import update_bn


def rounds_to_target(history: Sequence[dict[str, float]], target: float) -> int | None:
    """The first round (1-based) with ``train_accuracy >= target``; None if never."""
    for row in history:
        if row["train_accuracy"] >= target:
            return int(row["epoch"])
    return None


@torch.no_grad()
def sigma_distance(
    posterior: PosteriorFile,
    x: Input,
    y: torch.Tensor,
    multiples: Sequence[float],
    draws: int,
    seed: int,
    bn_x: Input | None = None,
    batch_size: int = 1000,
) -> list[dict[str, float]]:
    """Accuracy and NLL at theta_bar + m sigma * z: one row per (m, draw).

    sigma is the SWAG diagonal's standard deviation; with one snapshot it is
    zero, and every m gives theta_bar (the rows say so through ``sigma_norm``).
    ``bn_x``: training inputs to recompute BatchNorm statistics per network.
    """
    assert posterior.collector is not None
    device = x.device
    swag = SWAG.from_state_dict(posterior.collector, device=device)
    mean, sigma = swag.mean, ieee.sqrt(swag.variance())
    model = for_inference(posterior.build_model(device))
    needs_bn = has_batchnorm(model)
    if needs_bn and bn_x is None:
        raise ValueError("a BatchNorm model needs training inputs for its statistics")
    generator = torch.Generator(device=device).manual_seed(seed)
    zs = [torch.randn(mean.shape, generator=generator, device=device) for _ in range(draws)]
    rows = []
    for m in multiples:
        for d, z in enumerate(zs):
            load_theta(model, mean + m * sigma * z, {})
            if needs_bn:
                update_bn(model, bn_x, batch_size)
            logp = log_softmax_predictions(model, x, batch_size)
            rows.append(
                {
                    "multiple": float(m),
                    "draw": d,
                    "accuracy": (logp.argmax(1) == y).double().mean().item(),
                    "nll": torch.nn.functional.nll_loss(logp, y).item(),
                    "sigma_norm": float(sigma.norm()),
                }
            )
    return rows
