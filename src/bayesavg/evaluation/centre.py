"""The network at a posterior's centre(s) and the sharpness of the training loss there.

A posterior's centre is its mean (SWA, SWAG), its members' (ensembles) or the point
estimate: ``predictors.sampling.centres`` lists them for a method. ``centre_sharpness``
averages ``sharpness``'s two measures over them, for the evaluate stage's sharpness
table and the report's claims on flat minima.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..data.inputs import Input
from ..models import for_inference, has_batchnorm
from ..posteriors.file import PosteriorFile, load_theta
from ..predictors.sampling import centres
from ..training.batchnorm import update_bn
from .evaluate import method_of
from .sharpness import hessian_trace, sam_sharpness


def center_model(
    posterior: PosteriorFile,
    theta: torch.Tensor,
    buffers: dict[str, torch.Tensor] | None,
    bn_x: Input | None,
    device: torch.device | str,
    batch_size: int = 1000,
) -> nn.Module:
    """The network at ``theta``, with ``buffers`` or BatchNorm recomputed, in eval mode."""
    model = for_inference(posterior.build_model(device))
    with torch.no_grad():
        load_theta(model, theta.to(device), buffers or {})
    if buffers is None and bn_x is not None and has_batchnorm(model):
        update_bn(model, bn_x, batch_size)
    return model.eval()


def centre_sharpness(
    posterior: PosteriorFile,
    method: str,
    x: Input,
    y: torch.Tensor,
    *,
    bn_x: Input | None,
    rho: float,
    probes: int,
    seed: int,
    device: torch.device | str,
    batch_size: int = 1000,
) -> dict[str, float]:
    """Sharpness of the training loss (model-ready ``x``, labels ``y``) at the centre(s),
    averaged over them; ``hessian_trace_se`` is tr(H)'s standard error over the probes
    (absent with one probe), so a difference of two traces can be told from probe noise."""
    y = y.to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    sam, traces, variances = [], [], []
    for theta, buffers in centres(posterior, method_of(method)):
        model = center_model(posterior, theta, buffers, bn_x, device, batch_size)
        sam.append(sam_sharpness(model, x, y, rho, batch_size))
        found = hessian_trace(model, x, y, probes, gen, batch_size)
        traces.append(found.mean().item())
        if probes > 1:
            variances.append(found.double().var().item() / probes)
    m = len(traces)
    found_se = {"hessian_trace_se": math.sqrt(sum(variances)) / m} if probes > 1 else {}
    return {"sharpness": sum(sam) / m, "hessian_trace": sum(traces) / m, **found_se}
