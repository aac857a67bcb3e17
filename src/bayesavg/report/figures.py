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
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

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


def _plain_log_ticks(axis: Any, span: float) -> None:
    """Ticks a reader can read off a log axis: plain numbers, enough of them.

    Within a factor 3 the log axis is nearly linear, so linear steps suit;
    up to four decades 1-2-5 steps; beyond that, decades only.
    """
    if span <= 3:
        axis.set_major_locator(MaxNLocator(nbins=6))
    elif span <= 1e4:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def sigma_figure(predictors: list[PredictorResult]) -> bytes | None:
    """One box per variational predictor from its precomputed sigma / sigma_0 quantiles.

    The per-weight ratios themselves never reach the report, so ``bxp``
    draws the quantiles directly: box p25-p75, median line, whiskers
    p01-p99, min and max as triangles, the mean as a diamond. None
    when no predictor reports the ratio.
    """
    ratios = [(p.name, r) for p in predictors if (r := p.sigma_ratio) is not None]
    if not ratios:
        return None
    stats = [
        {
            "label": name,
            "q1": r["p25"],
            "med": r["median"],
            "q3": r["p75"],
            "whislo": r["p01"],
            "whishi": r["p99"],
            "mean": r["mean"],
        }
        for name, r in ratios
    ]
    fig = Figure(figsize=(max(5.0, 1.0 + 0.9 * len(stats)) + 2.5, 4.5), layout="constrained")
    ax = fig.subplots()
    median = {"color": _COLOURS[1], "linewidth": 2}
    mean = {"marker": "D", "markerfacecolor": _COLOURS[0], "markeredgecolor": "k", "ms": 5}
    extreme = {"linestyle": "none", "markerfacecolor": "none", "markeredgecolor": "0.3", "ms": 6}
    ax.bxp(
        stats,
        showmeans=True,
        showfliers=False,
        medianprops=median,
        meanprops={**mean, "linestyle": "none"},
    )
    positions = range(1, len(stats) + 1)
    ax.plot(positions, [r["max"] for _, r in ratios], marker="^", **extreme)
    ax.plot(positions, [r["min"] for _, r in ratios], marker="v", **extreme)
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    lo = min(1.0, *(r["min"] for _, r in ratios))
    hi = max(1.0, *(r["max"] for _, r in ratios))
    _plain_log_ticks(ax.yaxis, hi / lo)
    ax.set_ylabel(r"$\sigma / \sigma_0$ per weight (log scale)")
    ax.set_title(r"Posterior $\sigma$ relative to its initial value $\sigma_0$")
    if len(stats) > 3 or max(len(s["label"]) for s in stats) > 8:
        for label in ax.get_xticklabels():
            label.set(rotation=30, horizontalalignment="right", rotation_mode="anchor")
    handles = [
        Patch(facecolor="none", edgecolor="k", label="p25 - p75"),
        Line2D([], [], label="median", **median),
        Line2D([], [], color="k", linewidth=1, label="whiskers: p01 - p99"),
        Line2D([], [], linestyle="none", label="mean", **mean),
        Line2D([], [], marker="^", label="max", **extreme),
        Line2D([], [], marker="v", label="min", **extreme),
        Line2D([], [], color="0.4", linestyle="--", linewidth=1, label=r"$\sigma = \sigma_0$"),
    ]
    fig.legend(handles=handles, loc="outside right upper", fontsize="small")
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
        "sigma",
        lambda inputs: sigma_figure(inputs.predictors),
        "Per-weight posterior standard deviation sigma of each variational predictor, "
        "divided by sigma_0, the standard deviation the VI run was initialised with (log "
        "scale). Box: the middle half of the weights (p25 to p75), with the median as a "
        "line; whiskers: p01 to p99; open triangles: the largest (up) and smallest (down) "
        "ratio; diamond: the mean. Dashed line: sigma = sigma_0. Values near 1 mean the variance "
        "barely moved from its initialisation.",
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
