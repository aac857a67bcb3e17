"""Every report figure, as PNG bytes (or None when it has no data).

Figures are drawn on bare ``matplotlib.figure.Figure`` objects (no pyplot,
hence no global backend or figure state; Agg renders the PNG) and saved
without software metadata, so identical inputs give byte-identical PNGs.
``FIGURES`` lists them in report order with their captions.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import matplotlib
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator

from .inputs import PlaneData, PredictorResult, ReportInputs

_COLOURS = matplotlib.colormaps["tab10"].colors


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def reliability_figure(predictors: list[PredictorResult]) -> bytes | None:
    """Calibration gap and reliability bars per predictor; None without non-empty bins."""
    if not any(r.get("count", 0) > 0 for p in predictors for r in p.reliability):
        return None
    fig = Figure(figsize=(10, 4), layout="constrained")
    gap_ax, rel_ax = fig.subplots(1, 2)
    width = 1.0 / max(len(predictors), 1)
    for i, p in enumerate(predictors):
        rows = [r for r in p.reliability if r.get("count", 0) > 0]
        conf = [r["confidence"] for r in rows]
        acc = [r["accuracy"] for r in rows]
        colour = _COLOURS[i % len(_COLOURS)]
        style = {"color": colour, "marker": "o", "ms": 3, "label": p.name}
        gap_ax.plot(conf, [a - c for a, c in zip(acc, conf, strict=True)], **style)
        # Classic reliability bars: one bar per non-empty bin, side by side per predictor.
        bin_width = [r["upper"] - r["lower"] for r in rows]
        left = [r["lower"] + i * width * w for r, w in zip(rows, bin_width, strict=True)]
        rel_ax.bar(
            left,
            acc,
            width=[width * w for w in bin_width],
            align="edge",
            color=colour,
            alpha=0.8,
            label=p.name,
        )
    gap_ax.axhline(0.0, color="k", linestyle="--", linewidth=1)
    gap_ax.set(xlabel="confidence", ylabel="accuracy - confidence", title="Calibration gap")
    rel_ax.plot([0, 1], [0, 1], color="k", linestyle="--", linewidth=1, label="perfect")
    rel_ax.set(
        xlabel="confidence (bin)", ylabel="accuracy", title="Reliability", xlim=(0, 1), ylim=(0, 1)
    )
    for ax in (gap_ax, rel_ax):
        ax.legend(fontsize="small")
    return _png(fig)


def samples_figure(predictors: list[PredictorResult]) -> bytes | None:
    """NLL, accuracy and ECE of the model average by sample count; None without rows."""
    if not any(p.by_samples for p in predictors):
        return None
    fig = Figure(figsize=(10, 4), layout="constrained")
    panels = [("nll", "NLL", 1.0), ("accuracy", "accuracy (%)", 100.0), ("ece", "ECE", 1.0)]
    for ax, (key, label, factor) in zip(fig.subplots(1, 3), panels, strict=True):
        for i, p in enumerate(predictors):
            rows = [r for r in p.by_samples if key in r]
            xs = [r["samples"] for r in rows]
            ys = [factor * r[key] for r in rows]
            colour = _COLOURS[i % len(_COLOURS)]
            if len(rows) == 1:
                ax.axhline(ys[0], color=colour, linestyle=":", label=p.name)
                ax.plot(xs, ys, color=colour, marker="s", ms=4)
            elif rows:
                ax.plot(xs, ys, color=colour, marker="o", ms=3, label=p.name)
        ax.set(xlabel="samples", ylabel=label, title=f"{label} vs samples")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.axes[0].legend(fontsize="small")
    return _png(fig)


def training_figure(histories: dict[str, list[dict[str, float]]]) -> bytes | None:
    """Pretraining first, then each trajectory continuing after its last epoch.

    None when no run has a single epoch.
    """
    if not any(histories.values()):
        return None
    fig = Figure(figsize=(10, 4), layout="constrained")
    loss_ax, acc_ax = fig.subplots(1, 2)
    pretrain = histories.get("pretrain", [])
    offset = len(pretrain)
    runs = [("pretrain", 0, "0.3")] if "pretrain" in histories else []
    others = [name for name in histories if name != "pretrain"]
    runs += [(n, offset, _COLOURS[i % len(_COLOURS)]) for i, n in enumerate(others)]
    for name, shift, colour in runs:
        for ax, metric in ((loss_ax, "loss"), (acc_ax, "accuracy")):
            for split, style in (("train", "-"), ("val", "--")):
                rows = [r for r in histories[name] if f"{split}_{metric}" in r]
                if rows:
                    xs = [shift + r["epoch"] for r in rows]
                    ys = [r[f"{split}_{metric}"] for r in rows]
                    ax.plot(xs, ys, style, color=colour, marker=".", label=f"{name} {split}")
    for ax, label in ((loss_ax, "loss"), (acc_ax, "accuracy")):
        if pretrain and others:
            ax.axvline(max(r["epoch"] for r in pretrain) + 0.5, color="k", ls=":", lw=1)
        ax.set(xlabel="epoch", ylabel=label, title=f"Training {label}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.legend(fontsize="small")
    return _png(fig)


def _trajectories(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Trajectory sections of the raw params that are mappings."""
    finetune = params.get("finetune", {})
    return (
        {k: v for k, v in finetune.items() if isinstance(v, dict)}
        if isinstance(finetune, dict)
        else {}
    )


def epoch_offset(
    name: str, trajectories: dict[str, dict[str, Any]], histories: dict[str, list[dict[str, float]]]
) -> float:
    """Epochs before ``name`` starts, counted from the end of pretraining."""
    offset, seen = 0.0, {name}
    start = trajectories.get(name, {}).get("start", "pretrain")
    while start in trajectories and start not in seen:
        rows = histories.get(start, [])
        offset += max((r["epoch"] for r in rows), default=trajectories[start].get("epochs", 0))
        seen.add(start)
        start = trajectories[start].get("start", "pretrain")
    return offset


def finetune_curves_figure(inputs: ReportInputs) -> bytes | None:
    """VI-family runs after pretraining: iterate solid, running average dashed.

    None when no VI-family history has per-epoch test columns (older runs).
    """
    trajectories = _trajectories(inputs.params)
    names = [
        n
        for n, t in trajectories.items()
        if t.get("kind") in ("vi", "hwa")
        and any("test_accuracy" in r for r in inputs.histories.get(n, []))
    ]
    if not names:
        return None
    fig = Figure(figsize=(13, 4), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = [
        ("train_loss", None, "Training loss", "negative ELBO per point", 1.0),
        ("test_loss", "avg_test_loss", "Test NLL", "NLL", 1.0),
        ("test_accuracy", "avg_test_accuracy", "Test accuracy", "accuracy (%)", 100.0),
    ]
    for i, name in enumerate(names):
        colour = _COLOURS[i % len(_COLOURS)]
        shift = epoch_offset(name, trajectories, inputs.histories)
        rows = inputs.histories[name]
        for ax, (key, avg_key, _, _, factor) in zip(axes, panels, strict=True):
            for column, style, label in ((key, "-", name), (avg_key, "--", f"{name} average")):
                points = [
                    (shift + r["epoch"], factor * r[column])
                    for r in rows
                    if column is not None and column in r and math.isfinite(r[column])
                ]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, style, color=colour, marker=".", label=label)
    for ax, (_, _, title, label, _) in zip(axes, panels, strict=True):
        ax.set(xlabel="epochs since the end of pretraining", ylabel=label, title=title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.legend(fontsize="small")
    return _png(fig)


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


def _plane_panel(fig: Figure, ax: Any, name: str, plane: PlaneData) -> None:
    a_values, b_values, z = plane_grid(plane.grid)
    finite = z[np.isfinite(z)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    log = lo > 0 and hi / lo > 10
    if hi <= lo:
        hi = lo + max(abs(lo), 1.0) * 1e-3
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
    for ax, (name, plane) in zip(axes, planes.items(), strict=False):
        _plane_panel(fig, ax, name, plane)
    for ax in axes[len(planes) :]:
        ax.set_axis_off()
    return _png(fig)


@dataclass(frozen=True)
class FigureSpec:
    """A report figure: its file name, how to draw it and what it shows."""

    name: str
    draw: Callable[[ReportInputs], bytes | None]
    caption: str


FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec(
        "reliability",
        lambda inputs: reliability_figure(inputs.predictors),
        "Calibration gap (left) and reliability curves (right); empty bins skipped.",
    ),
    FigureSpec(
        "samples",
        lambda inputs: samples_figure(inputs.predictors),
        "Metrics of the Bayesian model average against the number of samples.",
    ),
    FigureSpec(
        "training",
        lambda inputs: training_figure(inputs.histories),
        "Pretraining then fine-tuning; solid train, dashed validation.",
    ),
    FigureSpec(
        "finetune_curves",
        finetune_curves_figure,
        "VI-family fine-tuning, in epochs since the end of pretraining; a trajectory that "
        "starts from another continues after it (hwa after vi). Solid: the iterate (the "
        "variational mean mu); dashed: the running average of the snapshots taken so far. "
        "The training loss is the per-point negative ELBO that was optimised. The test "
        "curves are for monitoring only and were not used for any choice.",
    ),
    FigureSpec(
        "loss_plane",
        lambda inputs: plane_figure(inputs.planes),
        "Mean training cross-entropy of the network whose weights lie on the plane of the "
        "first two principal components of each trajectory's last snapshots (orthonormal "
        "directions in weight space, centred at their running average; for VI-family runs "
        "the snapshots are the means mu), on a fixed random subset of training images. "
        "Markers: the snapshots in collection order, the average (star), and the start "
        "projected onto the plane. The legend's losses are at the points themselves; the "
        "snapshots and the start can lie off the plane (the start's distance is given), "
        "while the contours show the plane only.",
    ),
)


def draw_figures(inputs: ReportInputs) -> dict[str, bytes]:
    """PNG bytes by figure name, in report order; figures without data are left out."""
    drawn = {spec.name: spec.draw(inputs) for spec in FIGURES}
    return {name: png for name, png in drawn.items() if png is not None}
