"""Loss-landscape geometry around posterior centres (SWA paper §4, DSWAG Figs. 4 and 6).

Three probes of the same network at weight vectors w, each with BatchNorm
statistics recomputed at w from a fixed training subset (ALGORITHMS §6):

- ``line``: w(t) = w_A + t (w_B - w_A) on a t-grid that may leave [0, 1]
  (SGD -> SWA: is SGD at the edge of the basin whose centre SWA finds?);
- ``ray``: w(s) = w_0 + s d / |d| along seeded random directions, the same
  directions from every centre compared, optionally filter-normalised to
  w_0 (each output row of a weight tensor scaled to that row's norm in w_0,
  1-D parameters zeroed), and ``width``: the distance at which the train
  loss first exceeds its value at s = 0 by delta;
- ``principal_directions``: the top principal directions of a SWAG
  deviation matrix and the standard deviation along each.

Each evaluated point reports the data term of the train loss and the
weight-decay term (lambda / 2) |w|^2 separately, the train error, the test
error and the test NLL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..data.inputs import Input
from ..posteriors.file import load_theta
from ..training.batches import Tensors
from ..training.batchnorm import bn_modules, update_bn
from ..training.flat import params_vector
from ..training.train import loss_and_accuracy


@dataclass(frozen=True)
class Probe:
    """The data every point is evaluated on (model-ready inputs on the model's device).

    ``bn_x``: training inputs for the BatchNorm statistics (None: no BN).
    ``weight_decay``: the lambda of the weight-decay term (lambda / 2) |w|^2.
    """

    train_x: Input
    train_y: torch.Tensor
    test_x: Input
    test_y: torch.Tensor
    bn_x: Input | None = None
    weight_decay: float = 0.0
    batch_size: int = 1000


@torch.no_grad()
def evaluate_at(model: nn.Module, theta: torch.Tensor, probe: Probe) -> dict[str, float]:
    """The network at ``theta`` (BatchNorm recomputed): train loss and its weight-decay term,
    train error, test error and test NLL."""
    theta = theta.to(next(model.parameters()))
    load_theta(model, theta, {})
    if probe.bn_x is not None and bn_modules(model):
        update_bn(model, probe.bn_x, probe.batch_size)
    model.eval()
    train, test = Tensors(probe.train_x, probe.train_y), Tensors(probe.test_x, probe.test_y)
    train_loss, train_acc = loss_and_accuracy(model, train, probe.batch_size)
    test_nll, test_acc = loss_and_accuracy(model, test, probe.batch_size)
    return {
        "train_loss": train_loss.item(),
        "weight_decay_term": 0.5 * probe.weight_decay * float(theta.double().square().sum()),
        "train_error": 1 - train_acc.item(),
        "test_error": 1 - test_acc.item(),
        "test_nll": test_nll.item(),
    }


@torch.no_grad()
def train_loss_at(model: nn.Module, theta: torch.Tensor, probe: Probe) -> float:
    """The data term of the train loss alone at ``theta`` (BatchNorm recomputed): what a
    width's bisection needs, at half the cost of ``evaluate_at``."""
    load_theta(model, theta.to(next(model.parameters())), {})
    if probe.bn_x is not None and bn_modules(model):
        update_bn(model, probe.bn_x, probe.batch_size)
    model.eval()
    loss, _ = loss_and_accuracy(model, Tensors(probe.train_x, probe.train_y), probe.batch_size)
    return loss.item()


def ray_width(
    model: nn.Module,
    theta0: torch.Tensor,
    direction: torch.Tensor,
    rows: Sequence[dict[str, float]],
    delta: float,
    probe: Probe,
    tolerance: float = 1e-3,
) -> float | None:
    """``width`` along a ray whose grid rows (from ``ray``) are already evaluated: only the
    bisection's points cost a forward pass."""
    known = {row["distance"]: row["train_loss"] for row in rows}
    u, w0 = unit(direction), theta0.double()

    def loss_at(s: float) -> float:
        if s in known:
            return known[s]
        return train_loss_at(model, (w0 + s * u).to(theta0.dtype), probe)

    return width(loss_at, delta, sorted(known), tolerance)


def line(
    model: nn.Module,
    theta_a: torch.Tensor,
    theta_b: torch.Tensor,
    ts: Sequence[float],
    probe: Probe,
) -> list[dict[str, float]]:
    """Rows (t, metrics) at w(t) = w_A + t (w_B - w_A); t = 0 and t = 1 give w_A and w_B
    exactly, so those rows equal the centres' own evaluation."""
    a, b = theta_a.double(), theta_b.double()
    rows = []
    for t in ts:
        point = a if t == 0 else b if t == 1 else a + t * (b - a)
        rows.append({"t": float(t), **evaluate_at(model, point.to(theta_a.dtype), probe)})
    return rows


def random_directions(d: int, count: int, seed: int) -> torch.Tensor:
    """``count`` Gaussian directions in R^d, float64, from ``seed`` alone: every centre
    compared is probed along the same ones."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, d, generator=generator, dtype=torch.float64)


def filter_normalise(
    direction: torch.Tensor, theta0: torch.Tensor, model: nn.Module
) -> torch.Tensor:
    """Li et al.'s filter normalisation: each output row of each weight tensor of ``direction``
    rescaled to the norm of the same row of ``theta0``; 1-D parameters (biases, BatchNorm
    affine) set to zero, so the ray moves only the filters, at their own scale."""
    out = torch.zeros_like(direction, dtype=torch.float64)
    offset = 0
    for p in model.parameters():
        n = p.numel()
        if p.dim() > 1:
            rows = p.shape[0]
            d = direction[offset : offset + n].double().reshape(rows, -1)
            w = theta0[offset : offset + n].double().reshape(rows, -1)
            d_norm = torch.linalg.vector_norm(d, dim=1, keepdim=True)
            w_norm = torch.linalg.vector_norm(w, dim=1, keepdim=True)
            scaled = d * (w_norm / d_norm.clamp(min=torch.finfo(torch.float64).tiny))
            out[offset : offset + n] = scaled.reshape(-1)
        offset += n
    if offset != direction.numel():
        raise ValueError(f"direction has {direction.numel()} entries, the model {offset}")
    return out


def unit(direction: torch.Tensor) -> torch.Tensor:
    """``direction`` / |direction| in float64."""
    d = direction.double()
    return d / torch.linalg.vector_norm(d)


def ray(
    model: nn.Module,
    theta0: torch.Tensor,
    direction: torch.Tensor,
    distances: Sequence[float],
    probe: Probe,
) -> list[dict[str, float]]:
    """Rows (distance, metrics) at w(s) = w_0 + s d / |d|."""
    u, w0 = unit(direction), theta0.double()
    return [
        {"distance": float(s), **evaluate_at(model, (w0 + s * u).to(theta0.dtype), probe)}
        for s in distances
    ]


def width(
    loss_at: Callable[[float], float],
    delta: float,
    distances: Sequence[float],
    tolerance: float = 1e-4,
) -> float | None:
    """The distance at which ``loss_at`` first exceeds ``loss_at(0) + delta``.

    The increasing, non-negative ``distances`` are scanned for the first point
    above the level, then the crossing is bisected between it and the point
    before to ``tolerance`` (relative to the step). None if no point exceeds it.
    """
    grid = sorted(float(s) for s in distances)
    if not grid or grid[0] != 0.0:
        grid = [0.0, *grid]
    level = loss_at(0.0) + delta
    lo = 0.0
    for s in grid[1:]:
        if loss_at(s) > level:
            hi, step = s, s - lo
            while hi - lo > tolerance * step:
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if loss_at(mid) > level else (mid, hi)
            return (lo + hi) / 2
        lo = s
    return None


def principal_directions(
    state: dict[str, torch.Tensor | int], count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top ``count`` principal directions (rows, unit norm) of a SWAG collector's
    deviation matrix D (K x d) and the standard deviation along each, s_i / sqrt(K - 1)
    from the SVD of D: the directions SWAG's low-rank part samples along."""
    devs = torch.as_tensor(state["deviations"]).double()
    k = devs.shape[0]
    if k < 2:
        raise ValueError(f"principal directions need at least 2 deviations, the collector has {k}")
    _, s, vh = torch.linalg.svd(devs, full_matrices=False)
    count = min(count, vh.shape[0])
    signs = torch.sign(vh[:count].gather(1, vh[:count].abs().argmax(1, keepdim=True)))
    return vh[:count] * signs, s[:count] / math.sqrt(k - 1)


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """The model's parameters as one vector (the layout every function here uses)."""
    return params_vector(model.parameters()).detach()
