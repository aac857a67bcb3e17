"""How each predictor method draws its networks from a posterior file (ALGORITHMS §2-§5).

One sampling function per method, registered under the method's name with
``@sampler``; everything else about a method (what it needs, its default
scale, its centre, its label) is its entry in ``bayesavg.config.methods``. Weights
are produced on the evaluation device, one network at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..config.methods import METHODS, PROVIDES, REGISTRY, Method
from ..data.inputs import Input
from ..models import has_dropout
from ..posteriors import HWA, SWAG
from ..posteriors.file import PosteriorFile
from ..posteriors.laplace_predictive import probit_log_probs
from ..posteriors.last_layer_laplace import LastLayerLaplace
from ..runtime.errors import UserError
from ..training import ieee

Buffers = dict[str, torch.Tensor]
Network = tuple[torch.Tensor, Buffers | None]


@dataclass(frozen=True)
class Draws:
    """How a predictor produces its S networks.

    ``draw(s)`` gives the weights of network s (0-based) and its BatchNorm
    buffers, or None to recompute them on training data (ALGORITHMS §6);
    ``count`` fixes S (None: the ``n_samples`` asked for); ``dropout`` keeps
    dropout layers stochastic at prediction time (MC dropout); ``predict``: a closed-form
    predictive of the loaded network, (model, inputs, batch size) -> float64
    log-probabilities, in place of its softmax (the Laplace probit).
    """

    draw: Callable[[int], Network]
    count: int | None
    dropout: bool = False
    predict: Callable[[nn.Module, torch.Tensor, int], torch.Tensor] | None = None


@dataclass(frozen=True)
class Request:
    """What a sampling function is asked for."""

    method: Method
    scale: float
    generator: torch.Generator
    device: torch.device
    n_samples: int


Sampler = Callable[[PosteriorFile, Request], Draws]
SAMPLERS: dict[str, Sampler] = {}


def sampler(*names: str) -> Callable[[Sampler], Sampler]:
    """Register a sampling function for the registry methods ``names``."""

    def register(fn: Sampler) -> Sampler:
        for name in names:
            if name not in METHODS:
                raise ValueError(f"{name!r} has no entry in bayesavg.config.methods")
            SAMPLERS[name] = fn
        return fn

    return register


def _own(posterior: PosteriorFile, device: torch.device) -> Network:
    return posterior.theta.to(device), {k: v.to(device) for k, v in posterior.buffers.items()}


@sampler("map")
def _map(posterior: PosteriorFile, req: Request) -> Draws:
    network = _own(posterior, req.device)
    return Draws(lambda s: network, 1)


@sampler("mc_dropout")
def _mc_dropout(posterior: PosteriorFile, req: Request) -> Draws:
    if not has_dropout(posterior.build_model()):
        raise UserError(
            f"mc_dropout: trajectory {posterior.trajectory!r} has no dropout; train one with "
            "a dropout rate above 0"
        )
    network = _own(posterior, req.device)
    return Draws(lambda s: network, None, dropout=True)


def _swag(posterior: PosteriorFile, device: torch.device | str) -> SWAG:
    assert posterior.collector is not None
    swag = SWAG.from_state_dict(posterior.collector, device=device)
    if swag.n_collected == 0:
        raise UserError(f"trajectory {posterior.trajectory!r} collected no SWAG snapshots")
    return swag


def _hwa_state(posterior: PosteriorFile, device: torch.device | str) -> HWA:
    assert posterior.hwa is not None
    hwa = HWA.from_state_dict(posterior.hwa, device=device)
    if hwa.n_collected == 0:
        raise UserError(f"trajectory {posterior.trajectory!r} collected no HWA snapshots")
    return hwa


def whole(
    posterior: PosteriorFile, device: torch.device | str, base: torch.Tensor | None = None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A vector of the parameters the posterior covers -> the network's whole weight
    vector, the rest taken from ``base`` (default: the file's theta). The identity for a
    posterior that covers everything (``posterior.params`` unset)."""
    index = posterior.covered_index(device)
    if index is None:
        return lambda v: v
    rest = (posterior.theta if base is None else base).to(device)
    return lambda v: rest.clone().index_copy_(0, index, v.to(rest.dtype))


@sampler("swa")
def _swa(posterior: PosteriorFile, req: Request) -> Draws:
    mean = whole(posterior, req.device)(_swag(posterior, req.device).mean)
    return Draws(lambda s: (mean, None), 1)


@sampler("swag", "swag_diag")
def _swag_draws(posterior: PosteriorFile, req: Request) -> Draws:
    swag = _swag(posterior, req.device)
    full = whole(posterior, req.device)
    diag_only = req.method.name == "swag_diag"
    if not diag_only and swag.rank < 2:
        raise UserError(f"swag needs at least 2 snapshots, {posterior.trajectory} has {swag.rank}")
    draw = swag.sampler(req.scale, diag_only=diag_only, generator=req.generator)
    return Draws(lambda s: (full(draw()), None), None)


@sampler("vi")
def _vi(posterior: PosteriorFile, req: Request) -> Draws:
    assert posterior.rho is not None
    mu = posterior.theta.to(req.device)
    sigma = torch.nn.functional.softplus(posterior.rho.to(req.device))

    def draw(s: int) -> Network:
        return mu + sigma * torch.randn(mu.shape, generator=req.generator, device=req.device), None

    return Draws(draw, None)


@sampler("hwa", "hwa_mf", "hwa_rho")
def _hwa(posterior: PosteriorFile, req: Request) -> Draws:
    hwa = _hwa_state(posterior, req.device)
    variant = req.method.name
    return Draws(lambda s: (hwa.sample(variant, req.scale, req.generator), None), None)


@sampler("ensemble")
def _ensemble(posterior: PosteriorFile, req: Request) -> Draws:
    assert posterior.samples is not None and posterior.samples["buffers"] is not None
    thetas = posterior.samples["theta"].to(req.device)
    buffers = [{k: v.to(req.device) for k, v in b.items()} for b in posterior.samples["buffers"]]
    return Draws(lambda s: (thetas[s], buffers[s]), thetas.shape[0])


def _member_swags(posterior: PosteriorFile, device: torch.device | str) -> list[SWAG]:
    assert posterior.samples is not None
    swags = [SWAG.from_state_dict(c, device=device) for c in posterior.samples["collectors"]]
    if any(swag.n_collected == 0 for swag in swags):
        raise UserError(f"a member of trajectory {posterior.trajectory!r} collected no snapshots")
    return swags


def _member_wholes(
    posterior: PosteriorFile, device: torch.device | str
) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """Each member's ``whole``: its uncovered parameters are its own final weights."""
    assert posterior.samples is not None
    return [whole(posterior, device, theta) for theta in posterior.samples["theta"]]


@sampler("multiswa")
def _multiswa(posterior: PosteriorFile, req: Request) -> Draws:
    swags, fulls = _member_swags(posterior, req.device), _member_wholes(posterior, req.device)
    means = [full(swag.mean) for swag, full in zip(swags, fulls, strict=True)]
    return Draws(lambda s: (means[s], None), len(means))


@sampler("multiswag")
def _multiswag(posterior: PosteriorFile, req: Request) -> Draws:
    """S draws from each of the M members' SWAG, interleaved (network s from member s mod M),
    so every prefix of the M * S networks is as near an equal mixture as it can be."""
    swags = _member_swags(posterior, req.device)
    if any(swag.rank < 2 for swag in swags):
        raise UserError(
            f"multiswag needs at least 2 snapshots per member of {posterior.trajectory}"
        )
    fulls = _member_wholes(posterior, req.device)
    drawn = [swag.sampler(req.scale, generator=req.generator) for swag in swags]
    m = len(swags)
    return Draws(lambda s: (fulls[s % m](drawn[s % m]()), None), m * req.n_samples)


def _laplace(posterior: PosteriorFile, device: torch.device) -> tuple[LastLayerLaplace, str, slice]:
    """The Laplace posterior, its layer's name, and where that layer's parameters sit in
    theta (the file's check made sure the layer is the network's last linear one)."""
    assert posterior.laplace is not None
    la = LastLayerLaplace.from_state_dict(posterior.laplace, device)
    layer = posterior.laplace["layer"]
    offset = 0
    for name, param in posterior.build_model().named_parameters():
        if name.rpartition(".")[0] == layer:
            return la, layer, slice(offset, offset + la.num_params)
        offset += param.numel()
    raise UserError(f"trajectory {posterior.trajectory!r}: no layer {layer!r} in the network")


@sampler("laplace")
def _laplace_probit(posterior: PosteriorFile, req: Request) -> Draws:
    la, name, _ = _laplace(posterior, req.device)
    network = _own(posterior, req.device)

    def predict(model: nn.Module, x: Input, batch_size: int) -> torch.Tensor:
        return probit_log_probs(la, model, name, x, batch_size)

    return Draws(lambda s: network, 1, predict=predict)


@sampler("laplace_mc")
def _laplace_mc(posterior: PosteriorFile, req: Request) -> Draws:
    """The MAP network with its last layer drawn from the Laplace posterior: the GLM and
    the network predictive coincide, the layer being linear in its parameters."""
    la, _, where = _laplace(posterior, req.device)
    theta, buffers = _own(posterior, req.device)

    def draw(s: int) -> Network:
        drawn = theta.clone()
        drawn[where] = la.sample(None, req.generator).to(theta.dtype)
        return drawn, buffers

    return Draws(draw, None)


@sampler("sgld")
def _sgld(posterior: PosteriorFile, req: Request) -> Draws:
    assert posterior.samples is not None
    thetas = posterior.samples["theta"][-req.n_samples :].to(req.device)
    return Draws(lambda s: (thetas[s], None), thetas.shape[0])


def draws(
    posterior: PosteriorFile,
    method: Method,
    scale: float,
    generator: torch.Generator,
    device: torch.device,
    n_samples: int,
) -> Draws:
    """The S networks of ``method`` from ``posterior``; a file that lacks what it needs
    is a ``UserError`` saying what it needs."""
    if method.needs not in posterior.provides():
        raise UserError(
            f"predictor {method.name} needs {PROVIDES[method.needs]}; the posterior of "
            f"trajectory {posterior.trajectory!r} has none"
        )
    return SAMPLERS[method.name](posterior, Request(method, scale, generator, device, n_samples))


# Where sharpness is measured, per ``Method.centre``.
def _centre_weights(posterior: PosteriorFile, method: Method) -> list[Network]:
    return [(posterior.theta, posterior.buffers if method.own_buffers else None)]


def _centre_snapshot_mean(posterior: PosteriorFile, method: Method) -> list[Network]:
    return [(whole(posterior, "cpu")(_swag(posterior, "cpu").mean), None)]


def _centre_hwa_mean(posterior: PosteriorFile, method: Method) -> list[Network]:
    return [(_hwa_state(posterior, "cpu").mu.mean, None)]


def _centre_samples_mean(posterior: PosteriorFile, method: Method) -> list[Network]:
    assert posterior.samples is not None
    return [(posterior.samples["theta"].mean(0), None)]


def _centre_members(posterior: PosteriorFile, method: Method) -> list[Network]:
    assert posterior.samples is not None
    return list(zip(posterior.samples["theta"], posterior.samples["buffers"], strict=True))


def _centre_member_means(posterior: PosteriorFile, method: Method) -> list[Network]:
    swags, fulls = _member_swags(posterior, "cpu"), _member_wholes(posterior, "cpu")
    return [(full(swag.mean), None) for swag, full in zip(swags, fulls, strict=True)]


CENTRES: dict[str, Callable[[PosteriorFile, Method], list[Network]]] = {
    "weights": _centre_weights,
    "snapshot_mean": _centre_snapshot_mean,
    "hwa_mean": _centre_hwa_mean,
    "samples_mean": _centre_samples_mean,
    "members": _centre_members,
    "member_means": _centre_member_means,
}


# A trajectory's one centre, by what its file provides (most specific first).
_TRAJECTORY_CENTRES = (
    ("hwa", "hwa_mean"),
    ("snapshots", "snapshot_mean"),
    ("samples", "samples_mean"),
)


def trajectory_centre(posterior: PosteriorFile) -> tuple[str, torch.Tensor]:
    """The centre of a trajectory's posterior (where landscapes are probed from) and its
    kind: the HWA mean, the SWA mean of the snapshots, the mean of the SGLD samples, or
    else the final weights (the SGD iterate, VI's mu). An ensemble has no one centre."""
    provides = posterior.provides()
    if "members" in provides:
        raise UserError(
            f"trajectory {posterior.trajectory!r} is an ensemble: its members sit in different "
            "basins and have no one centre"
        )
    kind = next((c for need, c in _TRAJECTORY_CENTRES if need in provides), "weights")
    if kind == "weights":
        return kind, posterior.theta
    theta, _ = CENTRES[kind](posterior, REGISTRY["map"])[0]
    return kind, theta


def centres(posterior: PosteriorFile, method: Method) -> list[Network]:
    """Where ``method``'s sharpness is measured: weights and buffers (None: recompute BN).

    theta for map, mc_dropout (dropout off) and vi (mu); the SWA mean; the HWA
    mean; the mean of the kept SGLD samples; every ensemble member, whose
    sharpness values are averaged (members sit in different basins, so their
    weight average is not a meaningful centre).
    """
    if method.needs not in posterior.provides():
        raise UserError(
            f"predictor {method.name} needs {PROVIDES[method.needs]}; the posterior of "
            f"trajectory {posterior.trajectory!r} has none"
        )
    return CENTRES[method.centre](posterior, method)


# A variational method's per-weight sigma, per ``Method.sigma``.
SIGMAS: dict[str, Callable[[PosteriorFile], torch.Tensor]] = {
    "rho": lambda p: torch.nn.functional.softplus(p.rho),  # type: ignore[arg-type]
    "hwa_var": lambda p: ieee.sqrt(_hwa_state(p, "cpu").var.mean.clamp(min=0)),
    "hwa_rho": lambda p: torch.nn.functional.softplus(_hwa_state(p, "cpu").rho.mean),
}
SIGMA_QUANTILES = {
    "p01": 0.01,
    "p10": 0.1,
    "p25": 0.25,
    "median": 0.5,
    "p75": 0.75,
    "p90": 0.9,
    "p99": 0.99,
}


def sigma_ratio(posterior: PosteriorFile, method: Method) -> dict[str, float] | None:
    """Quantiles of sigma / sigma_0 over the weights, for a variational method: how far
    training moved the variances from where the variational run started (None for
    other methods, or a file that does not record sigma_0)."""
    sigma0 = posterior.extra.get("sigma_init")
    if method.sigma is None or sigma0 is None or method.needs not in posterior.provides():
        return None
    ratio = SIGMAS[method.sigma](posterior).double() / float(sigma0)
    levels = ratio.new_tensor(list(SIGMA_QUANTILES.values()))
    values = torch.quantile(ratio, levels).tolist()
    return {
        "min": ratio.min().item(),
        **dict(zip(SIGMA_QUANTILES, values, strict=True)),
        "max": ratio.max().item(),
        "mean": ratio.mean().item(),
    }
