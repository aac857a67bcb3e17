"""Training: pretraining then every fine-tuning run, and the VI family's curves against
its running average."""

from __future__ import annotations

import math
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .. import style
from ..blocks import (
    Section,
    figure_section,
)
from ..inputs import ReportInputs, trajectory_params
from ..uncertainty import Uncertainty

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
    train loss only when ``loss`` (it is on the row's scale). A run that trains nothing
    (laplace) has validation points only: drawn large and named in the legend."""
    trained = any("train_accuracy" in r for r in history)
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
            named = ax is axes[2] and (ls == "-" or not trained)
            label = (name if trained else f"{name} (no training)") if named else None
            marker = dict(marker=".", ms=3) if trained else dict(marker="o", ms=5)
            ax.plot(xs, [r[column] for r in rows], ls, color=colour, label=label, **marker)


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
    fig, axes = style.grid(len(rows), len(_TRAINING_PANELS), 13.0, 2.5)
    for row, (title, elbo, names) in zip(axes, rows, strict=True):
        if pretrain:
            _plot_run(row, pretrain, 0.0, style.BASELINE_COLOUR, "pretrain", not elbo)
        for i, name in enumerate(names):
            shift = run_offset(name, trajectories, inputs.histories)
            colour = style.TAB10[i % len(style.TAB10)]
            _plot_run(row, inputs.histories[name], shift, colour, name, True)
        labels = ("negative ELBO per point" if elbo else "cross-entropy", "NLL", "accuracy")
        for ax, label, (_, what) in zip(row, labels, _TRAINING_PANELS, strict=True):
            ax.set(ylabel=label + _log_if_wide(ax))
            ax.set_title(f"{title}: {what}", fontsize="medium")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            if pretrain and names:
                ax.axvline(max(r["epoch"] for r in pretrain) + 0.5, color="k", ls=":", lw=1)
        lo, hi = min(ax.get_xlim()[0] for ax in row), max(ax.get_xlim()[1] for ax in row)
        for ax in row:  # one epoch axis per row, whichever panel a run has points in
            ax.set_xlim(lo, hi)
        style.row_legend(row[-1], title="accuracy: solid train,\ndashed validation")
    for ax in axes[-1]:
        ax.set_xlabel("epoch")
    return fig


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
        colour = style.TAB10[i % len(style.TAB10)]
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
    style.row_legend(axes[-1])
    return style.png(fig)


CAPTIONS = {
    "training": (
        "Pretraining (grey) then fine-tuning, one row per family: the training loss, the "
        "validation NLL and the accuracy (solid train, dashed validation), each on its own "
        "axis. VI and HWA minimise a per-point negative ELBO, on a different scale from the "
        "cross-entropy of the other runs, so they get rows of their own (without pretraining's "
        "training loss). A run that starts from another continues after it; one that "
        "trains nothing (laplace, fitted at its start's weights) is a single point there: "
        "its predictive's validation NLL and accuracy."
    ),
    "finetune_curves": (
        "VI-family fine-tuning, in epochs since the end of pretraining; a trajectory that "
        "starts from another continues after it (hwa after vi). Solid: the iterate (the "
        "variational mean mu); dashed: the running average of the snapshots taken so far. "
        "The training loss is the per-point negative ELBO that was optimised. The test "
        "curves are for monitoring only and were not used for any choice."
    ),
}


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    return Section(
        figure_section("training", style.png_or_none(training_layout(inputs)), CAPTIONS["training"])
        + figure_section(
            "finetune_curves", finetune_curves_figure(inputs), CAPTIONS["finetune_curves"]
        )
    )
