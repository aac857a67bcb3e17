"""Predict with a posterior: sample weights, update BN, average probabilities.

The hot path keeps everything on the device: weights are written straight
into one model with ``vector_to_parameters`` (no state-dict copies), test
inputs are pre-normalised tensors, and the BMA is accumulated in log space.
Metrics for s = 1..S samples come from the running average at no extra
forward passes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import vector_to_parameters
from tqdm.auto import tqdm

from .batchnorm import update_bn
from .data import to_input
from .errors import UserError
from .methods import METHODS
from .metrics import Reliability, classification_metrics, reliability
from .models import dropout_modules, has_batchnorm, has_dropout
from .posterior_file import PosteriorFile, load_theta
from .posteriors import HWA, SWAG
from .seeding import isolated_rng
from .sharpness import hessian_trace, sam_sharpness

log = logging.getLogger(__name__)

DEFAULT_SCALE = {"swag_diag": 1.0, "swag": 0.5, "hwa": 0.5}
# Methods whose networks come with their own BatchNorm statistics (the file's).
OWN_BUFFERS = ("map", "mc_dropout", "ensemble")


@dataclass(frozen=True)
class Evaluation:
    metrics: dict[str, float]
    reliability: Reliability
    by_samples: list[dict[str, float]]
    log_probs: torch.Tensor


@dataclass(frozen=True)
class Draws:
    """How a predictor produces its S networks.

    ``draw(s)`` gives the weights of network s (0-based) and its BatchNorm
    buffers, or None to recompute them on training data (ALGORITHMS §6);
    ``count`` fixes S (None: the ``n_samples`` asked for); ``dropout`` keeps
    dropout layers stochastic at prediction time (MC dropout).
    """

    draw: Callable[[int], tuple[torch.Tensor, dict[str, torch.Tensor] | None]]
    count: int | None
    dropout: bool = False


def needs_bn_data(method: str) -> bool:
    """Whether ``method`` recomputes BatchNorm statistics (so needs training inputs)."""
    return method not in OWN_BUFFERS


def sampler(
    posterior: PosteriorFile,
    method: str,
    scale: float,
    generator: torch.Generator,
    device: torch.device,
    n_samples: int = 30,
) -> Draws:
    """The S networks of ``method`` from ``posterior``, weights on ``device``."""
    if method not in METHODS:
        raise UserError(f"unknown predictor {method!r}; choose one of {', '.join(METHODS)}")
    if method in ("map", "mc_dropout"):
        theta = posterior.theta.to(device)
        buffers = {k: v.to(device) for k, v in posterior.buffers.items()}
        if method == "mc_dropout" and not has_dropout(posterior.build_model()):
            raise UserError(
                f"mc_dropout: trajectory {posterior.trajectory!r} has no dropout; train one with "
                "a dropout rate above 0"
            )
        return Draws(lambda s: (theta, buffers), 1 if method == "map" else None, method != "map")
    if method in ("ensemble", "sgld"):
        return _stored(posterior, method, device, n_samples)
    if method == "vi":
        if posterior.rho is None:
            raise UserError(f"predictor vi needs a vi/hwa trajectory, not {posterior.trajectory!r}")
        mu = posterior.theta.to(device)
        sigma = torch.nn.functional.softplus(posterior.rho.to(device))

        def draw_vi(s: int) -> tuple[torch.Tensor, None]:
            return mu + sigma * torch.randn(mu.shape, generator=generator, device=device), None

        return Draws(draw_vi, None)
    if method.startswith("hwa"):
        if posterior.hwa is None:
            raise UserError(
                f"predictor {method} needs an hwa trajectory, not {posterior.trajectory!r}"
            )
        hwa = HWA.from_state_dict(posterior.hwa, device=device)
        if hwa.n_collected == 0:
            raise UserError(f"{method}: trajectory {posterior.trajectory!r} collected no snapshots")
        return Draws(lambda s: (hwa.sample(method, scale=scale, generator=generator), None), None)
    if posterior.collector is None:
        raise UserError(
            f"predictor {method} needs a SWAG posterior, but trajectory "
            f"{posterior.trajectory!r} collected no snapshots"
        )
    swag = SWAG.from_state_dict(posterior.collector, device=device)
    if method == "swa":
        mean = swag.mean
        return Draws(lambda s: (mean, None), 1)
    if method == "swag" and swag.rank < 2:
        raise UserError(f"swag needs at least 2 snapshots, {posterior.trajectory} has {swag.rank}")
    diag_only = method == "swag_diag"
    return Draws(
        lambda s: (swag.sample(scale=scale, diag_only=diag_only, generator=generator), None), None
    )


def _stored(posterior: PosteriorFile, method: str, device: torch.device, n_samples: int) -> Draws:
    """Ensemble members (all, with their own buffers) or the last S SGLD samples."""
    stored = posterior.samples
    is_ensemble = stored is not None and stored["buffers"] is not None
    if stored is None or is_ensemble != (method == "ensemble"):
        kind = "an ensemble" if method == "ensemble" else "an sgld"
        raise UserError(f"predictor {method} needs {kind} trajectory, not {posterior.trajectory!r}")
    thetas = stored["theta"].to(device)
    if method == "sgld":
        thetas = thetas[-n_samples:]
    buffers = [{k: v.to(device) for k, v in b.items()} for b in stored["buffers"] or []]
    return Draws(lambda s: (thetas[s], buffers[s] if buffers else None), thetas.shape[0])


@torch.inference_mode()
def log_softmax_predictions(
    model: nn.Module, x: torch.Tensor, batch_size: int, dropout: bool = False
) -> torch.Tensor:
    """Log-probabilities in eval mode; ``dropout`` keeps dropout layers sampling masks."""
    model.eval()
    for m in dropout_modules(model) if dropout else []:
        m.train()
    out = [
        torch.log_softmax(model(x[i : i + batch_size]).double(), dim=1)
        for i in range(0, x.shape[0], batch_size)
    ]
    return torch.cat(out)


def evaluate(
    posterior: PosteriorFile,
    method: str,
    splits: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    *,
    n_samples: int = 30,
    scale: float | None = None,
    bn_x: torch.Tensor | None = None,
    batch_size: int = 1000,
    ece_bins: int = 20,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> dict[str, Evaluation]:
    """Bayesian model average over ``n_samples`` weight samples of ``method``.

    ``splits`` maps a name ("test", "val") to model-ready inputs and labels;
    all splits share each sample and its BN update, in one forward pass.
    ``bn_x`` (training inputs) is required when the model has BatchNorm and
    the method samples weights.
    """
    device = torch.device(device)
    model = posterior.build_model(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    draws = sampler(
        posterior,
        method,
        DEFAULT_SCALE.get(method, 0.0) if scale is None else scale,
        generator,
        device,
        n_samples,
    )
    total = draws.count or n_samples
    needs_bn = needs_bn_data(method) and has_batchnorm(model)
    if needs_bn and bn_x is None:
        raise UserError(f"predictor {method} on a BatchNorm model needs training data for BN")
    names = list(splits)
    sizes = [splits[n][0].shape[0] for n in names]
    x_all = torch.cat([splits[n][0] for n in names]).to(device)
    ys = [splits[n][1].to(device) for n in names]
    log_sum: torch.Tensor | None = None
    per_s: dict[str, list[dict[str, torch.Tensor]]] = {n: [] for n in names}
    # Dropout masks come from torch's global stream: seed a private copy of it.
    with isolated_rng(seed, device):
        for s in tqdm(range(1, total + 1), desc=f"evaluate {method}", disable=None, leave=False):
            theta, buffers = draws.draw(s - 1)
            if buffers is None:
                with torch.no_grad():
                    vector_to_parameters(theta, model.parameters())
            else:
                load_theta(model, theta, buffers)
            if needs_bn:
                update_bn(model, bn_x, batch_size)
            logp = log_softmax_predictions(model, x_all, batch_size, dropout=draws.dropout)
            log_sum = logp if log_sum is None else torch.logaddexp(log_sum, logp)
            for name, bma, y in zip(names, (log_sum - math.log(s)).split(sizes), ys, strict=True):
                per_s[name].append(classification_metrics(bma, y, ece_bins))
    assert log_sum is not None
    bmas = (log_sum - math.log(total)).split(sizes)
    return {
        name: _summarise(per_s[name], bma, y, total, ece_bins)
        for name, bma, y in zip(names, bmas, ys, strict=True)
    }


def _summarise(
    per_s: list[dict[str, torch.Tensor]],
    bma: torch.Tensor,
    y: torch.Tensor,
    total: int,
    ece_bins: int,
) -> Evaluation:
    """Final metrics and the s = 1..S table, with one device-to-host copy."""
    keys = list(per_s[0])
    table = torch.stack([torch.stack([row[k] for k in keys]) for row in per_s]).tolist()
    by_samples = [
        {"samples": s, **dict(zip(keys, vals, strict=True))} for s, vals in enumerate(table, 1)
    ]
    metrics: dict[str, float] = dict(zip(keys, table[-1], strict=True))
    metrics["n"] = int(y.shape[0])
    metrics["n_samples"] = total
    return Evaluation(metrics, reliability(bma, y, ece_bins), by_samples, bma.cpu())


def model_input(
    posterior: PosteriorFile, x: torch.Tensor, device: torch.device | str
) -> torch.Tensor:
    """uint8 images normalised the way the posterior's network was trained."""
    return to_input(x, posterior.mean, posterior.std, device)


def centres(
    posterior: PosteriorFile, method: str
) -> list[tuple[torch.Tensor, dict[str, torch.Tensor] | None]]:
    """Where ``method``'s sharpness is measured: weights and buffers (None: recompute BN).

    theta for map, mc_dropout (dropout off) and vi (mu); the SWA mean; the HWA
    mean; the mean of the kept SGLD samples; every ensemble member, whose
    sharpness values are averaged (members sit in different basins, so their
    weight average is not a meaningful centre).
    """
    if method in ("swa", "swag_diag", "swag") and posterior.collector is not None:
        return [(SWAG.from_state_dict(posterior.collector).mean, None)]
    if method.startswith("hwa") and posterior.hwa is not None:
        return [(HWA.from_state_dict(posterior.hwa).mu.mean, None)]
    if method == "sgld" and posterior.samples is not None:
        return [(posterior.samples["theta"].mean(0), None)]
    if method == "ensemble" and posterior.samples is not None:
        thetas, buffers = posterior.samples["theta"], posterior.samples["buffers"]
        return list(zip(thetas, buffers, strict=True))
    return [(posterior.theta, None if method not in OWN_BUFFERS else posterior.buffers)]


def center_model(
    posterior: PosteriorFile,
    theta: torch.Tensor,
    buffers: dict[str, torch.Tensor] | None,
    bn_x: torch.Tensor | None,
    device: torch.device | str,
    batch_size: int = 1000,
) -> nn.Module:
    """The network at ``theta``, with ``buffers`` or BatchNorm recomputed, in eval mode."""
    model = posterior.build_model(device)
    load_theta(model, theta.to(device), buffers or {})
    if buffers is None and bn_x is not None and has_batchnorm(model):
        update_bn(model, bn_x, batch_size)
    return model.eval()


def centre_sharpness(
    posterior: PosteriorFile,
    method: str,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    bn_x: torch.Tensor | None,
    rho: float,
    probes: int,
    seed: int,
    device: torch.device | str,
    batch_size: int = 1000,
) -> dict[str, float]:
    """Sharpness of the training loss (model-ready ``x``, labels ``y``) at the centre(s)."""
    y = y.to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    values = []
    for theta, buffers in centres(posterior, method):
        model = center_model(posterior, theta, buffers, bn_x, device, batch_size)
        values.append(
            (
                sam_sharpness(model, x, y, rho, batch_size),
                hessian_trace(model, x, y, probes, gen, batch_size),
            )
        )
    return {
        "sharpness": sum(v[0] for v in values) / len(values),
        "hessian_trace": sum(v[1] for v in values) / len(values),
    }
