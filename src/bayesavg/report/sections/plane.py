"""The loss plane of each listed trajectory's last snapshots."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator

from .. import style
from ..blocks import (
    Section,
    figure_section,
)
from ..inputs import PlaneData, ReportInputs
from ..uncertainty import Uncertainty


def plane_grid(grid: list[dict[str, float]]) -> tuple[list[float], list[float], np.ndarray]:
    """Axis values and the loss as a (b, a) array; missing or non-finite cells masked."""
    a_values = sorted({r["a"] for r in grid})
    b_values = sorted({r["b"] for r in grid})
    col = {v: i for i, v in enumerate(a_values)}
    line = {v: i for i, v in enumerate(b_values)}
    z = np.full((len(b_values), len(a_values)), np.nan)
    for r in grid:
        z[line[r["b"]], col[r["a"]]] = r["loss"]
    return a_values, b_values, z


def colour_scale(planes: dict[str, PlaneData]) -> tuple[float, float, bool]:
    """One (low, high, log) for every panel, so that a colour is the same loss in each and
    panels side by side compare: log when the losses span more than a factor 10."""
    grids = [plane_grid(plane.grid)[2] for plane in planes.values()]
    finite = np.concatenate([z[np.isfinite(z)] for z in grids])
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    log = lo > 0 and hi / lo > 10
    if hi <= lo:
        hi = lo + max(abs(lo), 1.0) * 1e-3
    return lo, hi, log


def _plane_panel(
    fig: Figure, ax: Any, name: str, plane: PlaneData, scale: tuple[float, float, bool]
) -> None:
    a_values, b_values, z = plane_grid(plane.grid)
    lo, hi, log = scale
    levels = np.geomspace(lo, hi, 16) if log else np.linspace(lo, hi, 16)
    filled = ax.contourf(
        a_values,
        b_values,
        np.ma.masked_invalid(z),
        levels=levels,
        norm=LogNorm(lo, hi) if log else None,
        cmap="viridis",
    )
    bar = fig.colorbar(filled, ax=ax, label="training loss" + (" (log scale)" if log else ""))
    if log:
        bar.ax.yaxis.set_major_locator(LogLocator())
    snaps = sorted((r for r in plane.path if r["kind"] == "snapshot"), key=lambda r: r["index"])
    summary = plane.summary
    if snaps:
        n = summary.get("n_collected")
        label = f"snapshots {int(snaps[0]['index'])}..{int(snaps[-1]['index'])}"
        label += f" of {int(n)}" if n is not None else ""
        ax.plot(
            [r["a"] for r in snaps],
            [r["b"] for r in snaps],
            "-o",
            color="white",
            mec="black",
            ms=5,
            lw=1,
            label=label,
        )
        for r in (snaps[0], snaps[-1]):
            ax.annotate(
                str(int(r["index"])),
                (r["a"], r["b"]),
                xytext=(4, 4),
                textcoords="offset points",
                fontsize="small",
                color="white",
            )
    for r in plane.path:
        if r["kind"] == "average":
            label = f"average (loss {r['loss']:.3g})"
            ax.plot(r["a"], r["b"], "*", ms=15, color="red", mec="black", label=label)
        elif r["kind"] == "start":
            origin = summary.get("start")
            label = "start" + (f" {origin}" if origin else "") + f" (loss {r['loss']:.3g}), "
            label += f"{r['distance']:.3g} off the plane"
            ax.plot(r["a"], r["b"], "X", ms=10, color="orange", mec="black", label=label)
    ratio = summary.get("explained_variance_ratio", [math.nan, math.nan])
    points = summary.get("n_points")
    title = f"{name}: training loss" + (f" on {int(points)} images" if points else "")
    ax.set(
        xlabel=f"PC1 ({100 * ratio[0]:.1f}% of snapshot variance)",
        ylabel=f"PC2 ({100 * ratio[1]:.1f}% of snapshot variance)",
        title=title,
    )
    ax.legend(fontsize="small")


def plane_figure(planes: dict[str, PlaneData]) -> bytes | None:
    """One loss-plane panel per trajectory; None without planes."""
    if not planes:
        return None
    cols = min(len(planes), 2)
    rows = math.ceil(len(planes) / cols)
    fig = Figure(figsize=(6.5 * cols, 5 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    scale = colour_scale(planes)
    for ax, (name, plane) in zip(axes, planes.items(), strict=False):
        _plane_panel(fig, ax, name, plane, scale)
    for ax in axes[len(planes) :]:
        ax.set_axis_off()
    return style.png(fig)


CAPTION = (
    "Mean training cross-entropy of the network whose weights lie on the plane of the "
    "first two principal components of each trajectory's last snapshots (orthonormal "
    "directions in weight space, centred at their running average; for VI-family runs "
    "the snapshots are the means mu), on a fixed random subset of training images. "
    "Markers: the snapshots in collection order, the average (star), and the start "
    "projected onto the plane. The legend's losses are at the points themselves; the "
    "snapshots and the start can lie off the plane (the start's distance is given), "
    "while the contours show the plane only. Every panel has the same colour scale (log "
    "when the losses span more than a factor 10), so a colour is the same loss in each."
)


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    return Section(figure_section("loss_plane", plane_figure(inputs.planes), CAPTION))
