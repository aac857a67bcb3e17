"""The training loss on the plane of a trajectory's snapshots (HWA paper, §3.3).

The last K snapshots are rebuilt exactly from the moment collector's state
(mean and deviations), so training stores nothing extra. The plane is
spanned by their first two principal components and centred at the running
average (the SWA/HWA mean): the figure shows where the average sits among
the iterates it averages, and where the run started.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..data.inputs import Input
from ..models import has_batchnorm
from ..posteriors.file import load_theta
from ..runtime.errors import UserError
from ..training.batchnorm import update_bn


def snapshots(state: dict[str, Any]) -> torch.Tensor:
    """The last k = min(n_collected, max_rank) collected vectors, oldest first, (k, d) float64.

    Deviation row j is theta_j - mean_j, with mean_j the running mean right
    after theta_j was added. From the final mean backwards: theta_j = mean_j
    + d_j and mean_{j-1} = mean_j - d_j / (j - 1). Exact up to the precision
    the deviations are stored in.
    """
    n, d = int(state["n_collected"]), int(state["num_params"])
    k = min(n, int(state["max_rank"]))
    devs = state["deviations"].to(torch.float64)
    if devs.shape != (k, d):
        raise ValueError(f"deviations have shape {tuple(devs.shape)}, expected {(k, d)}")
    mean = state["mean"].to(torch.float64).clone()
    out = torch.empty(k, d, dtype=torch.float64, device=devs.device)
    for row in range(k - 1, -1, -1):
        j = n - (k - 1 - row)  # 1-based position of this snapshot among all n collected
        out[row] = mean + devs[row]
        if j > 1:
            mean -= devs[row] / (j - 1)
    return out


@dataclass(frozen=True)
class Plane:
    """An affine plane in weight space: ``centre`` + a * basis[0] + b * basis[1]."""

    centre: torch.Tensor  # (d,) float64
    basis: torch.Tensor  # (2, d) float64, orthonormal rows
    explained: tuple[float, float]  # share of the snapshots' variance along each direction

    def point(self, a: float, b: float) -> torch.Tensor:
        return self.centre + a * self.basis[0] + b * self.basis[1]

    def project(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Coordinates (m, 2) of vectors (m, d) or (d,), and their distances (m,) from the plane."""
        r = theta.to(self.centre).reshape(-1, self.centre.numel()) - self.centre
        coords = r @ self.basis.T
        return coords, torch.linalg.vector_norm(r - coords @ self.basis, dim=1)


def pca_plane(snaps: torch.Tensor, centre: torch.Tensor) -> Plane:
    """The plane through ``centre`` along the top two principal components of ``snaps``.

    Each direction's sign makes its largest-magnitude component positive, so
    the figure does not flip between reruns or machines.
    """
    k = snaps.shape[0]
    if k < 3:
        raise UserError(
            f"the loss plane needs at least 3 snapshots, the trajectory kept {k}; "
            "collect more (epochs, collect.every, collect.max_rank)"
        )
    x = snaps.to(torch.float64)
    _, s, vh = torch.linalg.svd(x - x.mean(0), full_matrices=False)
    power = s**2
    total = float(power.sum())
    if total == 0.0:
        raise UserError("the loss plane needs distinct snapshots; all of them are equal")
    basis = vh[:2].clone()
    for row in basis:
        if row[row.abs().argmax()] < 0:
            row.neg_()
    explained = (float(power[0]) / total, float(power[1]) / total)
    return Plane(centre.to(torch.float64).clone(), basis, explained)


def _axis(lo: float, hi: float, grid: int) -> torch.Tensor:
    """``grid`` evenly spaced values covering [lo, hi] (lo <= 0 <= hi), 0 being one of them.

    The average then sits exactly on a grid node, so the contour there is
    its own loss, not an interpolation.
    """
    below = round((grid - 1) * -lo / (hi - lo))
    below = min(max(below, 1 if lo < 0 else 0), grid - 2 if hi > 0 else grid - 1)
    above = grid - 1 - below
    step = max(-lo / below if below else 0.0, hi / above if above else 0.0)
    return torch.arange(-below, above + 1, dtype=torch.float64) * step


def grid_axes(points: torch.Tensor, grid: int, margin: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Axis values for a ``grid`` x ``grid`` mesh over ``points`` (m, 2) and the origin.

    Each axis spans the points' range widened by ``margin`` times that range
    on both sides (an axis of zero range borrows the other's, or 1).
    """
    if grid < 3:
        raise ValueError(f"grid must be >= 3, got {grid}")
    lo = [min(float(points[:, i].min()), 0.0) for i in range(2)]
    hi = [max(float(points[:, i].max()), 0.0) for i in range(2)]
    spans = [h - low for low, h in zip(lo, hi, strict=True)]
    fallback = max(spans) or 1.0
    axes = []
    for low, high, span in zip(lo, hi, spans, strict=True):
        span = span or fallback
        low, high = low - margin * span, high + margin * span
        if low == high:
            low, high = -span / 2, span / 2
        axes.append(_axis(low, high, grid))
    return axes[0], axes[1]


@torch.no_grad()
def losses(
    model: nn.Module,
    thetas: Iterable[torch.Tensor],
    x: Input,
    y: torch.Tensor,
    *,
    bn_x: Input | None = None,
    batch_size: int = 1000,
) -> tuple[list[float], list[float]]:
    """Mean cross-entropy and accuracy of ``model`` (eval mode) at each weight vector.

    The vectors are written into ``model`` (its parameters are overwritten);
    BatchNorm statistics are recomputed on ``bn_x`` at each. Results stay on
    the device until one copy at the end.
    """
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    needs_bn = has_batchnorm(model)
    if needs_bn and bn_x is None:
        raise UserError("the loss plane of a BatchNorm model needs training inputs for BN")
    x, y = x.to(device), y.to(device)
    results = []
    for theta in thetas:
        load_theta(model, theta.to(device=device, dtype=dtype), {})
        if needs_bn:
            update_bn(model, bn_x, batch_size)
        model.eval()
        loss = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        for start in range(0, x.shape[0], batch_size):
            logits = model(x[start : start + batch_size])
            yb = y[start : start + batch_size]
            loss += nn.functional.cross_entropy(logits, yb, reduction="sum").double()
            correct += (logits.argmax(1) == yb).sum()
        results.append(torch.stack([loss, correct.double()]) / x.shape[0])
    if not results:
        return [], []
    table = torch.stack(results).cpu().T.tolist()
    return table[0], table[1]


@dataclass(frozen=True)
class LossPlane:
    """A trajectory's loss plane: the geometry, the grid and the path rows (for CSV)."""

    plane: Plane
    n_collected: int
    grid: list[dict[str, float]]  # a, b, loss, accuracy; a outer, b inner
    path: list[dict[str, Any]]  # kind, index, a, b, distance, loss, accuracy

    def summary(self) -> dict[str, Any]:
        """The numbers a reader of the CSVs cannot recompute from them."""
        by_kind = {row["kind"]: row for row in self.path if row["kind"] != "snapshot"}
        start = by_kind.get("start")
        return {
            "n_collected": self.n_collected,
            "n_snapshots": sum(row["kind"] == "snapshot" for row in self.path),
            "explained_variance_ratio": list(self.plane.explained),
            "centre_loss": by_kind["average"]["loss"],
            "centre_accuracy": by_kind["average"]["accuracy"],
            "start_distance": None if start is None else start["distance"],
        }


def loss_plane(
    model: nn.Module,
    state: dict[str, Any],
    x: Input,
    y: torch.Tensor,
    *,
    grid: int = 21,
    margin: float = 0.25,
    start: torch.Tensor | None = None,
    bn_x: Input | None = None,
    batch_size: int = 1000,
) -> LossPlane:
    """Training loss and accuracy on the PCA plane of a collector's snapshots.

    ``state`` is a MomentCollector/SWAG ``state_dict()`` (for HWA, that of
    its mu collector); ``x``, ``y`` are model-ready inputs and labels. The
    path rows give each snapshot, the average and ``start`` (the vector the
    trajectory started from, which may lie off the plane): their projection,
    their distance from the plane and the loss at the vector itself.
    """
    snaps = snapshots(state)
    plane = pca_plane(snaps, state["mean"])
    n = int(state["n_collected"])
    points = [("snapshot", n - snaps.shape[0] + 1 + i, s) for i, s in enumerate(snaps)]
    points.append(("average", 0, plane.centre))
    if start is not None:
        points.insert(0, ("start", 0, start.to(torch.float64)))
    coords, dist = plane.project(torch.stack([v for _, _, v in points]))
    axis_a, axis_b = grid_axes(coords, grid, margin)
    mesh = [(float(a), float(b)) for a in axis_a for b in axis_b]

    device = next(model.parameters()).device
    on_device = Plane(plane.centre.to(device), plane.basis.to(device), plane.explained)

    def thetas() -> Iterator[torch.Tensor]:
        yield from (v for _, _, v in points)
        yield from (on_device.point(a, b) for a, b in mesh)

    loss, acc = losses(model, thetas(), x, y, bn_x=bn_x, batch_size=batch_size)
    m = len(points)
    path = [
        {
            "kind": kind,
            "index": index,
            "a": c[0],
            "b": c[1],
            "distance": r,
            "loss": loss[i],
            "accuracy": acc[i],
        }
        for i, ((kind, index, _), c, r) in enumerate(
            zip(points, coords.tolist(), dist.tolist(), strict=True)
        )
    ]
    rows = [
        {"a": a, "b": b, "loss": loss[m + i], "accuracy": acc[m + i]}
        for i, (a, b) in enumerate(mesh)
    ]
    return LossPlane(plane, n, rows, path)
