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

from . import style
from .distributed import SWEEP_PREDICTORS, dswag_roles, has_variance, sigma_curve
from .inputs import PlaneData, PredictorResult, ReportInputs, SweepPoint, trajectory_params

_COLOURS = matplotlib.colormaps["tab10"].colors


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _row_legend(ax: Any, title: str | None = None) -> None:
    """The panel's legend right of its axes, outside them; constrained layout makes room."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(
            handles,
            labels,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            borderaxespad=0.0,
            fontsize="small",
            title=title,
            title_fontsize="small",
        )


def _grid(rows: int, cols: int, width: float, height: float) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(width, 0.5 + height * rows), layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False)


def _family_members(inputs: ReportInputs) -> list[tuple[str, list[PredictorResult]]]:
    """Each family's panel members, the baseline first (grey, dotted) in every one."""
    base = style.baseline(inputs)
    lead = [base] if base is not None else []
    return [(title, lead + members) for title, members in style.families(inputs).items()]


def _line_style(p: PredictorResult, inputs: ReportInputs, colours: dict[str, Any]) -> dict:
    return {"color": colours.get(p.name, "k"), "linestyle": style.linestyle(p, inputs)}


def reliability_layout(inputs: ReportInputs) -> Figure | None:
    """Calibration gap per confidence bin, one panel per family; None without bins.

    Each panel draws its family's predictors (F-variants dashed in their
    reference's colour) and the baseline (grey, dotted); the legend gives each
    one's ECE and sits right of the panel.
    """
    if not any(r.get("count", 0) > 0 for p in inputs.predictors for r in p.reliability):
        return None
    families = _family_members(inputs)
    if not families:
        return None
    colours = style.colours(inputs)
    cols = 2
    rows = math.ceil(len(families) / cols)
    fig, axes = _grid(rows, cols, 13.0, 3.0)
    for ax, (title, members) in zip(axes.ravel(), families, strict=False):
        for p in members:
            bins = [r for r in p.reliability if r.get("count", 0) > 0]
            if not bins:
                continue
            ece = p.metric("ece")
            label = p.name + (f" (ECE {ece:.3f})" if math.isfinite(ece) else "")
            conf = [r["confidence"] for r in bins]
            gap = [r["accuracy"] - r["confidence"] for r in bins]
            ax.plot(conf, gap, marker="o", ms=3, label=label, **_line_style(p, inputs, colours))
        ax.axhline(0.0, color="k", linewidth=0.8)
        ax.set(xlim=(0, 1), title=title, xlabel="confidence", ylabel="accuracy - confidence")
        ax.grid(alpha=0.3)
        _row_legend(ax)
    for ax in axes.ravel()[len(families) :]:
        ax.set_axis_off()
    return fig


def reliability_figure(inputs: ReportInputs) -> bytes | None:
    fig = reliability_layout(inputs)
    return _png(fig) if fig is not None else None


_SAMPLE_PANELS = (("nll", "NLL", 1.0), ("accuracy", "accuracy (%)", 100.0), ("ece", "ECE", 1.0))


def samples_layout(inputs: ReportInputs) -> Figure | None:
    """NLL, accuracy and ECE of the model average by sample count: one row per family,
    the baseline in every row, the row's legend right of it. None without rows."""
    if not any(p.by_samples for p in inputs.predictors):
        return None
    families = [(t, ms) for t, ms in _family_members(inputs) if any(p.by_samples for p in ms)]
    colours = style.colours(inputs)
    fig, axes = _grid(len(families), len(_SAMPLE_PANELS), 13.0, 2.4)
    for row, (title, members) in zip(axes, families, strict=True):
        for ax, (key, label, factor) in zip(row, _SAMPLE_PANELS, strict=True):
            for p in members:
                points = [(r["samples"], factor * r[key]) for r in p.by_samples if key in r]
                line = _line_style(p, inputs, colours)
                if len(points) == 1:
                    ax.axhline(points[0][1], label=p.name, **line)
                elif points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, marker=".", ms=3, label=p.name, **line)
            ax.set(ylabel=label)
            ax.set_title(f"{title}: {label}", fontsize="medium")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        _row_legend(row[-1])
    for ax in axes[-1]:
        ax.set_xlabel("samples in the average")
    return fig


def samples_figure(inputs: ReportInputs) -> bytes | None:
    fig = samples_layout(inputs)
    return _png(fig) if fig is not None else None


# Trajectory kinds whose training loss is a per-point negative ELBO, not a cross-entropy.
_ELBO_KINDS = ("vi", "hwa")


def _training_rows(
    inputs: ReportInputs, trajectories: dict[str, dict[str, Any]]
) -> list[tuple[str, bool, list[str]]]:
    """(title, ELBO loss?, runs) per family: a run goes to its first predictor's family,
    split by loss so that a negative ELBO (~50) never shares an axis with a cross-entropy."""
    fam = {}
    for p in inputs.predictors:
        fam.setdefault(p.trajectory, style.family(p, inputs) or f"Baseline ({p.name})")
    order = [*style.FAMILIES, style.DISTRIBUTED, style.OTHER]
    rows: dict[tuple[str, bool], list[str]] = {}
    for name, history in inputs.histories.items():
        if name == "pretrain" or not history:
            continue
        elbo = trajectories.get(name, {}).get("kind") in _ELBO_KINDS
        rows.setdefault((fam.get(name, style.OTHER), elbo), []).append(name)
    keys = sorted(rows, key=lambda k: (order.index(k[0]) if k[0] in order else -1, k[1]))
    return [(f"{t} (negative ELBO)" if e else t, e, rows[(t, e)]) for t, e in keys]


# Training figure columns: (history column, panel title); each its own axis and scale.
_TRAINING_PANELS = (
    ("train_loss", "train loss"),
    ("val_loss", "validation NLL"),
    ("train_accuracy", "accuracy"),
)


def _plot_run(
    axes: Any, history: list[dict[str, float]], shift: float, colour: Any, name: str, loss: bool
) -> None:
    """Train loss, validation NLL, and train (solid) and validation (dashed) accuracy; the
    train loss only when ``loss`` (it is on the row's scale)."""
    series = [
        (axes[0], "train_loss", "-"),
        (axes[1], "val_loss", "-"),
        (axes[2], "train_accuracy", "-"),
        (axes[2], "val_accuracy", "--"),
    ]
    for ax, column, ls in series:
        if column == "train_loss" and not loss:
            continue
        rows = [r for r in history if column in r]
        if rows:
            xs = [shift + r["epoch"] for r in rows]
            label = name if ax is axes[2] and ls == "-" else None
            ax.plot(xs, [r[column] for r in rows], ls, color=colour, marker=".", ms=3, label=label)


def _log_if_wide(ax: Any) -> str:
    values = [y for line in ax.lines for y in line.get_ydata() if y > 0]
    if values and max(values) / min(values) > 50:
        ax.set_yscale("log")
        return " (log)"
    return ""


def training_layout(inputs: ReportInputs) -> Figure | None:
    """Train loss, validation NLL and accuracy per run, one row per family and kind of loss;
    None without epochs.

    A run that starts from another continues after it; pretraining (grey) is
    drawn in each row, its train cross-entropy only beside other cross-entropies.
    A loss axis is logarithmic when it spans more than a factor 50.
    """
    if not any(inputs.histories.values()):
        return None
    trajectories = trajectory_params(inputs.params)
    rows = _training_rows(inputs, trajectories) or [("Pretraining", False, [])]
    pretrain = inputs.histories.get("pretrain", [])
    fig, axes = _grid(len(rows), len(_TRAINING_PANELS), 13.0, 2.5)
    for row, (title, elbo, names) in zip(axes, rows, strict=True):
        if pretrain:
            _plot_run(row, pretrain, 0.0, style.BASELINE_COLOUR, "pretrain", not elbo)
        for i, name in enumerate(names):
            shift = run_offset(name, trajectories, inputs.histories)
            colour = _COLOURS[i % len(_COLOURS)]
            _plot_run(row, inputs.histories[name], shift, colour, name, True)
        labels = ("negative ELBO per point" if elbo else "cross-entropy", "NLL", "accuracy")
        for ax, label, (_, what) in zip(row, labels, _TRAINING_PANELS, strict=True):
            ax.set(ylabel=label + _log_if_wide(ax))
            ax.set_title(f"{title}: {what}", fontsize="medium")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            if pretrain and names:
                ax.axvline(max(r["epoch"] for r in pretrain) + 0.5, color="k", ls=":", lw=1)
        _row_legend(row[-1], title="accuracy: solid train,\ndashed validation")
    for ax in axes[-1]:
        ax.set_xlabel("epoch")
    return fig


def training_figure(inputs: ReportInputs) -> bytes | None:
    fig = training_layout(inputs)
    return _png(fig) if fig is not None else None


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


def run_offset(
    name: str, trajectories: dict[str, dict[str, Any]], histories: dict[str, list[dict[str, float]]]
) -> float:
    """Epochs before ``name`` starts on the training figure's axis (pretraining from 0).

    A chain of trajectories rooted at pretraining starts after its epochs; one
    rooted at a fresh network (``start: init``, DSWAG) starts at 0, beside it.
    """
    root, seen = trajectories.get(name, {}).get("start", "pretrain"), {name}
    while root in trajectories and root not in seen:
        seen.add(root)
        root = trajectories[root].get("start", "pretrain")
    before = len(histories.get("pretrain", [])) if root == "pretrain" else 0
    return before + epoch_offset(name, trajectories, histories)


def finetune_curves_figure(inputs: ReportInputs) -> bytes | None:
    """VI-family runs after pretraining: iterate solid, running average dashed.

    None when no VI-family history has per-epoch test columns (older runs).
    """
    trajectories = trajectory_params(inputs.params)
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
            for column, ls, label in ((key, "-", name), (avg_key, "--", f"{name} average")):
                points = [
                    (shift + r["epoch"], factor * r[column])
                    for r in rows
                    if column is not None and column in r and math.isfinite(r[column])
                ]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, ls, color=colour, marker=".", label=label)
    for ax, (_, _, title, label, _) in zip(axes, panels, strict=True):
        ax.set(xlabel="epochs since the end of pretraining", ylabel=label, title=title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _row_legend(axes[-1])
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


def _worker_colours(n: int) -> list[Any]:
    """One colour per worker count, ordered light to dark with W (viridis, no pale yellow)."""
    cmap = matplotlib.colormaps["viridis"]
    return [cmap(x) for x in np.linspace(0.85, 0.0, n)] if n > 1 else [cmap(0.3)]


def dswag_rounds_figure(sweep: list[SweepPoint]) -> bytes | None:
    """Fig. 5 left: the global model's train and test accuracy per phase-1 round, per W.

    The target (on train accuracy) is a dashed line; a star marks the round
    that reached it. None without a sweep history.
    """
    if not any(p.history for p in sweep):
        return None
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    train_ax, test_ax = fig.subplots(1, 2, sharey=True)
    target = sweep[0].target_accuracy
    for p, colour in zip(sweep, _worker_colours(len(sweep)), strict=True):
        rows = p.history
        label = f"W={p.workers}: " + (
            f"target at round {p.rounds_to_target}"
            if p.rounds_to_target is not None
            else f"not reached in {p.rounds} rounds"
        )
        xs = [r["epoch"] for r in rows]
        for ax, key in ((train_ax, "train_accuracy"), (test_ax, "test_accuracy")):
            points = [(x, 100 * r[key]) for x, r in zip(xs, rows, strict=True) if key in r]
            if points:
                ax.plot(*zip(*points, strict=True), color=colour, marker=".", ms=4, label=label)
        hit = [r for r in rows if r["epoch"] == p.rounds_to_target and "train_accuracy" in r]
        if hit:
            x, y = hit[0]["epoch"], 100 * hit[0]["train_accuracy"]
            train_ax.plot(x, y, "*", ms=13, color=colour, mec="black", zorder=3)
    train_ax.axhline(100 * target, color="k", linestyle="--", linewidth=1)
    test_ax.axhline(100 * target, color="0.5", linestyle=":", linewidth=1)
    train_ax.set(xlabel="phase-1 round", ylabel="accuracy (%)", title="Train accuracy")
    test_ax.set(xlabel="phase-1 round", title="Test accuracy")
    test_ax.tick_params(labelleft=True)
    for ax in (train_ax, test_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    handles, labels = train_ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], marker="*", ms=11, color="0.5", mec="black", linestyle="none"),
        Line2D([], [], color="k", linestyle="--", linewidth=1),
        Line2D([], [], color="0.5", linestyle=":", linewidth=1),
    ]
    labels += [
        "round that reached the target",
        f"target: {100 * target:g}% train accuracy",
        f"{100 * target:g}% on test (reference only)",
    ]
    fig.suptitle("Global (FedAvg) model after each phase-1 round")
    fig.legend(handles, labels, loc="outside right upper", fontsize="small", title="clients")
    return _png(fig)


def dswag_reliability_figure(
    dswag: PredictorResult | None, baseline: PredictorResult | None
) -> bytes | None:
    """Fig. 5 right: accuracy - confidence per confidence bin, DSWAG vs SWAG after
    distributed training, beside the number of test points per bin (log scale).

    None unless both predictors have a non-empty bin.
    """
    pair = [
        (p, label)
        for p, label in ((dswag, "DSWAG"), (baseline, "SWAG after distributed training"))
        if p is not None and any(r.get("count", 0) > 0 for r in p.reliability)
    ]
    if len(pair) < 2:
        return None
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    gap_ax, count_ax = fig.subplots(1, 2, width_ratios=(3, 2))
    width = 1.0 / len(pair)
    for i, (p, label) in enumerate(pair):
        rows = [r for r in p.reliability if r.get("count", 0) > 0]
        colour = _COLOURS[i % len(_COLOURS)]
        name = f"{p.name} ({label})"
        conf = [r["confidence"] for r in rows]
        gap = [r["accuracy"] - r["confidence"] for r in rows]
        gap_ax.plot(conf, gap, color=colour, marker="o", ms=4, label=name)
        bin_width = [r["upper"] - r["lower"] for r in rows]
        left = [r["lower"] + i * width * w for r, w in zip(rows, bin_width, strict=True)]
        count_ax.bar(
            left,
            [r["count"] for r in rows],
            width=[width * w for w in bin_width],
            align="edge",
            color=colour,
            alpha=0.8,
            label=name,
        )
    gap_ax.axhline(0.0, color="k", linestyle="--", linewidth=1)
    gap_ax.set(
        xlabel="confidence (max of the predictive probabilities)",
        ylabel="accuracy - confidence",
        title="Calibration gap per bin (20 bins)",
    )
    props = {"transform": gap_ax.transAxes, "fontsize": "small", "color": "0.3", "ha": "left"}
    gap_ax.text(0.02, 0.97, "above 0: under-confident", va="top", **props)
    gap_ax.text(0.02, 0.03, "below 0: over-confident", va="bottom", **props)
    gap_ax.grid(alpha=0.3)
    count_ax.set_yscale("log")
    count_ax.set(xlabel="confidence (bin)", ylabel="test points (log scale)", xlim=(0, 1))
    count_ax.set_title("Points per bin")
    handles, labels = gap_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small")
    return _png(fig)


def _symlog_multiples(ax: Any, ticks: list[float], linthresh: float) -> None:
    """A symlog x axis: 0 and the linear part first, then decades; ticks at ``ticks``."""
    ax.set_xscale("symlog", linthresh=linthresh, linscale=0.5)
    ax.set_xticks(ticks)
    ax.set_xlim(left=-0.3 * linthresh)  # nothing lies left of 0: no empty negative half
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def dswag_sigma_figure(sweep: list[SweepPoint]) -> bytes | None:
    """Fig. 6: test accuracy of theta_bar + m sigma z against m (left) and against
    m ||sigma||, the expected distance from theta_bar (right); mean over draws,
    min-max band, one curve per W. None without sigma-distance rows.
    """
    curves = [(p, c) for p in sweep if (c := sigma_curve(p)) is not None]
    if not curves:
        return None
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    m_ax, d_ax = fig.subplots(1, 2, sharey=True)
    multiples = sorted({m for _, c in curves for m in c.multiples})
    distances = sorted({m * c.sigma_norm for _, c in curves for m in c.multiples} - {0.0})
    handles = []
    for (p, c), colour in zip(curves, _worker_colours(len(curves)), strict=True):
        varied = has_variance(p, c)
        label = rf"W={p.workers}, $\|\sigma\|$ = {c.sigma_norm:.3g}"
        if not varied:
            label = rf"W={p.workers}: $\sigma = 0$ (< 2 snapshots: no variance)"
        mean = [100 * v for v in c.mean]
        style = {"color": colour, "marker": "o", "ms": 4, "linestyle": "-" if varied else ":"}
        (line,) = m_ax.plot(c.multiples, mean, label=label, **style)
        handles.append(line)
        low, high = [100 * v for v in c.low], [100 * v for v in c.high]
        m_ax.fill_between(c.multiples, low, high, color=colour, alpha=0.2)
        if varied:
            xs = [m * c.sigma_norm for m in c.multiples]
            d_ax.plot(xs, mean, **style)
            d_ax.fill_between(xs, low, high, color=colour, alpha=0.2)
    positive = [m for m in multiples if m > 0]
    _symlog_multiples(m_ax, multiples, min(positive, default=1.0))
    m_ax.set(
        xlabel=r"multiple $m$ of $\sigma$ (symmetric log scale; $m = 0$ is $\bar\theta$)",
        ylabel="test accuracy (%)",
        title=r"Accuracy of $\bar\theta + m\,\sigma \odot z$",
    )
    if distances:
        ticks = [0.0, *(v for v in (0.1, 0.3, 1, 3, 10, 30, 100, 300) if v <= max(distances))]
        _symlog_multiples(d_ax, ticks, min(distances))
    d_ax.set(
        xlabel=r"$m\,\|\sigma\|$, the expected distance from $\bar\theta$ (symmetric log)",
        title="The same against the distance",
    )
    d_ax.tick_params(labelleft=True)
    for ax in (m_ax, d_ax):
        ax.grid(alpha=0.3)
    handles.append(Patch(color="0.5", alpha=0.3, label="min to max over the draws z"))
    fig.legend(handles=handles, loc="outside right upper", fontsize="small", title="clients")
    return _png(fig)


def dswag_workers_figure(sweep: list[SweepPoint]) -> bytes | None:
    """Fig. 7: test NLL, accuracy and ECE of FedAvg, DSWA and DSWAG against W.

    None without a sweep point with metrics.
    """
    if not any(math.isfinite(p.metric(k, "nll")) for p in sweep for k, _ in SWEEP_PREDICTORS):
        return None
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    panels = [("nll", "NLL", 1.0), ("accuracy", "accuracy (%)", 100.0), ("ece", "ECE", 1.0)]
    markers = {"fedavg": "s", "dswa": "o", "dswag": "D"}
    ws = [p.workers for p in sweep]
    for ax, (key, label, factor) in zip(fig.subplots(1, 3), panels, strict=True):
        for i, (name, title) in enumerate(SWEEP_PREDICTORS):
            points = [
                (p.workers, factor * v) for p in sweep if math.isfinite(v := p.metric(name, key))
            ]
            missing = [p.workers for p in sweep if p.metrics.get(name) is None]
            text = title + (
                f" (none at W={', '.join(map(str, missing))}: no variance)" if missing else ""
            )
            if points:
                colour = _COLOURS[i % len(_COLOURS)]
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, color=colour, marker=markers[name], ms=5, label=text)
        if max(ws) / min(ws) > 3:
            ax.set_xscale("log")
        ax.set_xticks(ws)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(xlabel="W, clients (log scale)", ylabel=label, title=f"Test {label} vs W")
        ax.grid(alpha=0.3)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small")
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
        reliability_figure,
        "Calibration on the test split, one panel per family of predictors: accuracy - "
        "confidence per confidence bin (20 bins, empty ones skipped), with each predictor's "
        "ECE in the legend. Above 0 under-confident, below 0 over-confident. The baseline is "
        "grey and dotted in every panel; a flat-seeking (F-) variant is dashed in the colour of "
        "its reference.",
    ),
    FigureSpec(
        "samples",
        samples_figure,
        "Test NLL, accuracy and ECE of the Bayesian model average against the number of "
        "samples averaged, one row per family; the baseline (grey, dotted) in every row, "
        "F-variants dashed in their reference's colour. A single-sample predictor is a "
        "horizontal line.",
    ),
    FigureSpec(
        "training",
        training_figure,
        "Pretraining (grey) then fine-tuning, one row per family: the training loss, the "
        "validation NLL and the accuracy (solid train, dashed validation), each on its own "
        "axis. VI and HWA minimise a per-point negative ELBO, on a different scale from the "
        "cross-entropy of the other runs, so they get rows of their own (without pretraining's "
        "training loss). A run that starts from another continues after it.",
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
    FigureSpec(
        "dswag_rounds",
        lambda inputs: dswag_rounds_figure(inputs.dswag_sweep),
        "DSWAG phase 1 (FedAvg) for each number of clients W (the DSWAG paper's Fig. 5 left): "
        "accuracy of the global model after each round on the training split (left; phase 1 "
        "stops once it reaches the target, dashed; a star marks that round) and on the test "
        "split (right). The table gives the rounds to the target per W.",
    ),
    FigureSpec(
        "dswag_reliability",
        lambda inputs: dswag_reliability_figure(*_dswag_pair(inputs)),
        "Reliability of DSWAG and of SWAG after distributed training (the DSWAG paper's Fig. 5 "
        "right): accuracy - confidence per confidence bin (20 equal-width bins, empty bins "
        "skipped; left) and the test points per bin (right), since bins with few points are "
        "noisy. Above 0 the predictor is under-confident (right more often than it claims), "
        "below 0 over-confident; the paper's text states this sign the other way round, "
        "which is backwards.",
    ),
    FigureSpec(
        "dswag_sigma_distance",
        lambda inputs: dswag_sigma_figure(inputs.dswag_sweep),
        "Test accuracy of the single network theta_bar + m * sigma * z (theta_bar: the DSWAG "
        "mean, sigma: the square root of its diagonal variance, z ~ N(0, I) seeded, the same z "
        "for every m and W) for each number of clients W (the DSWAG paper's Fig. 6). Line: "
        "the mean over the draws z; band: their min to max. Left against the multiple m, right "
        "against m ||sigma||, the expected distance from theta_bar, since sigma differs by W. "
        "A W with fewer than 2 snapshots has sigma = 0 (dotted, left only): every m is theta_bar.",
    ),
    FigureSpec(
        "dswag_workers",
        lambda inputs: dswag_workers_figure(inputs.dswag_sweep),
        "Test NLL, accuracy and ECE of the FedAvg model, DSWA and DSWAG against the number of "
        "clients W (the DSWAG paper's Fig. 7). Each W is a separate run whose phase 1 stopped at "
        "the target or the round cap (see the rounds figure), so W also changes how long phase "
        "1 ran.",
    ),
)


def _dswag_pair(inputs: ReportInputs) -> tuple[PredictorResult | None, PredictorResult | None]:
    roles = dswag_roles(inputs)
    return (roles.dswag, roles.baseline) if roles is not None else (None, None)


def draw_figures(inputs: ReportInputs) -> dict[str, bytes]:
    """PNG bytes by figure name, in report order; figures without data are left out."""
    from . import analyses  # draws with this module's helpers; imported late, no cycle

    drawn = {spec.name: spec.draw(inputs) for spec in FIGURES}
    return {
        **{name: png for name, png in drawn.items() if png is not None},
        **analyses.draw(inputs),
    }
