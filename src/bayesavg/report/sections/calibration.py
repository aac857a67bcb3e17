"""Calibration: accuracy - confidence per confidence bin, one panel per family."""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from .. import style
from ..blocks import (
    Section,
    figure_section,
)
from ..inputs import ReportInputs
from ..uncertainty import Uncertainty


def reliability_layout(inputs: ReportInputs) -> Figure | None:
    """Calibration gap per confidence bin, one panel per family; None without bins.

    Each panel draws its family's predictors (F-variants dashed in their
    reference's colour) and the baseline (grey, dotted); the legend gives each
    one's ECE and sits right of the panel.
    """
    if not any(r.get("count", 0) > 0 for p in inputs.predictors for r in p.reliability):
        return None
    families = style.family_members(inputs)
    if not families:
        return None
    colours = style.colours(inputs)
    cols = 2
    rows = math.ceil(len(families) / cols)
    fig, axes = style.grid(rows, cols, 13.0, 3.0)
    for ax, (title, members) in zip(axes.ravel(), families, strict=False):
        for p in members:
            bins = [r for r in p.reliability if r.get("count", 0) > 0]
            if not bins:
                continue
            ece = p.metric("ece")
            label = p.name + (f" (ECE {ece:.3f})" if math.isfinite(ece) else "")
            conf = [r["confidence"] for r in bins]
            gap = [r["accuracy"] - r["confidence"] for r in bins]
            ax.plot(
                conf, gap, marker="o", ms=3, label=label, **style.line_style(p, inputs, colours)
            )
        ax.axhline(0.0, color="k", linewidth=0.8)
        ax.set(xlim=(0, 1), title=title, xlabel="confidence", ylabel="accuracy - confidence")
        ax.grid(alpha=0.3)
        style.row_legend(ax)
    for ax in axes.ravel()[len(families) :]:
        ax.set_axis_off()
    return fig


CAPTION = (
    "Calibration on the test split, one panel per family of predictors: accuracy - "
    "confidence per confidence bin (20 bins, empty ones skipped), with each predictor's "
    "ECE in the legend. Above 0 under-confident, below 0 over-confident. The baseline is "
    "grey and dotted in every panel; a flat-seeking (F-) variant is dashed in the colour of "
    "its reference."
)


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    return Section(
        figure_section("reliability", style.png_or_none(reliability_layout(inputs)), CAPTION)
    )
