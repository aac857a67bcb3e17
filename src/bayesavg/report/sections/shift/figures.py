"""Dataset shift's figures: metrics against the rotation angle by family, and the NLL gap
to the baseline with its intervals; each a bare ``Figure`` (None without data)."""

from __future__ import annotations

import math
from typing import Any

from matplotlib.figure import Figure

from ... import style
from ...inputs import PredictorResult, ReportInputs
from .measures import ShiftGap, angles, shift_value, temperature_control

# (shift metric, axis label, factor)
SHIFT_PANELS = (
    ("accuracy", "accuracy (%)", 100.0),
    ("nll", "NLL", 1.0),
    ("ece", "ECE", 1.0),
    ("entropy", "entropy H[p̄] (nats)", 1.0),
)


def _shift_groups(inputs: ReportInputs) -> dict[str, list[PredictorResult]]:
    """Family -> predictors with rotations, the baseline first in each."""
    base = style.baseline(inputs)
    lead = [base] if base is not None and angles(base) else []
    groups = {
        title: lead + [p for p in ps if angles(p)] for title, ps in style.families(inputs).items()
    }
    return {t: ps for t, ps in groups.items() if any(p.name != inputs.baseline for p in ps)}


def shift_figure(inputs: ReportInputs) -> Figure | None:
    """Accuracy, NLL, ECE and entropy against rotation angle: a row per family, a column
    per metric (each on its own axis)."""
    groups = _shift_groups(inputs)
    if not groups:
        return None
    colours = style.colours(inputs)
    fig = Figure(layout="constrained")
    axes = style.series_axes(fig, len(groups), len(SHIFT_PANELS))
    for row, (title, ps) in zip(axes, groups.items(), strict=True):
        for ax, (key, label, factor) in zip(row, SHIFT_PANELS, strict=True):
            for p in ps:
                xs = [a for a, _ in angles(p)]
                ys = [factor * shift_value(p, n, key) for _, n in angles(p)]
                ax.plot(
                    xs, ys, marker="o", ms=3, label=p.name, **style.line_style(p, inputs, colours)
                )
            ax.set_xticks([0, 45, 90, 135, 180])
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        row[0].set_title(title, loc="left", fontsize="medium", fontweight="bold")
        style.row_legend(row[-1], framed=False)
    for ax in axes[-1]:
        ax.set_xlabel("rotation (degrees)")
    return fig


def _errors(g: ShiftGap) -> list[list[float]] | None:
    """Matplotlib's (below, above) error lengths of the gap's intervals, if it has them."""
    bounds = g.bounds()
    if bounds is None:
        return None
    return [
        [v - lo for v, lo in zip(g.gap, bounds[0], strict=True)],
        [hi - v for v, hi in zip(g.gap, bounds[1], strict=True)],
    ]


def _gap_line(ax: Any, g: ShiftGap, marker: str, label: str, **style_kw: Any) -> None:
    """One predictor's gap against angle, with its interval bars."""
    ax.errorbar(
        g.angles, g.gap, yerr=_errors(g), marker=marker, ms=3, capsize=2, label=label, **style_kw
    )


def shift_gap_figure(inputs: ReportInputs, gaps: list[ShiftGap]) -> Figure | None:
    """NLL(baseline) - NLL(predictor) against angle with 95% paired-bootstrap bars, a panel
    per family, the temperature-scaled baseline (the control) in every panel."""
    if not gaps:
        return None
    base = style.baseline(inputs)
    found = temperature_control(inputs, base) if base is not None else None
    control = next((g for g in gaps if found is not None and g.predictor == found.name), None)
    by_name = {g.predictor: g for g in gaps if g is not control}
    groups = {
        t: [by_name[p.name] for p in ps if p.name in by_name]
        for t, ps in style.families(inputs).items()
    }
    groups = {t: gs for t, gs in groups.items() if gs}
    if not groups:  # single networks only (map_ts, swa): no family panel to draw
        return None
    colours = style.colours(inputs)
    predictors = {p.name: p for p in inputs.predictors}
    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig = Figure(layout="constrained")
    axes = style.series_axes(fig, rows, cols, width=4.2, height=2.8).ravel()
    for ax, (title, gs) in zip(axes, groups.items(), strict=False):
        if control is not None:
            label = f"{control.predictor} (control)"
            _gap_line(ax, control, "s", label, color=style.BASELINE_COLOUR, linestyle="--")
        for g in gs:
            kw = style.line_style(predictors[g.predictor], inputs, colours)
            _gap_line(ax, g, "o", g.predictor, **kw)
        ax.axhline(0.0, color="k", linewidth=0.8)
        ax.set_title(title, fontsize="medium")
        ax.set_xticks([0, 45, 90, 135, 180])
        ax.set(xlabel="rotation (degrees)", ylabel=f"NLL({inputs.baseline}) - NLL(predictor)")
        ax.grid(alpha=0.3)
        style.row_legend(ax, framed=False)
    for ax in axes[len(groups) :]:
        ax.set_axis_off()
    return fig
