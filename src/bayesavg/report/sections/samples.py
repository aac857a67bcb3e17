"""Samples: the model average's NLL, accuracy and ECE against the samples it averages."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .. import style
from ..blocks import (
    Section,
    figure_section,
)
from ..inputs import ReportInputs
from ..uncertainty import Uncertainty

_SAMPLE_PANELS = (("nll", "NLL", 1.0), ("accuracy", "accuracy (%)", 100.0), ("ece", "ECE", 1.0))


def samples_layout(inputs: ReportInputs) -> Figure | None:
    """NLL, accuracy and ECE of the model average by sample count: one row per family
    that averages (a row of single networks, such as map_ts alone, would be flat lines
    only), the baseline in every row, the row's legend right of it. None without rows."""
    families = [
        (t, ms)
        for t, ms in style.family_members(inputs)
        if any(len(p.by_samples) > 1 for p in ms if p.name != inputs.baseline)
    ]
    if not families:
        return None
    colours = style.colours(inputs)
    fig, axes = style.grid(len(families), len(_SAMPLE_PANELS), 13.0, 2.4)
    for row, (title, members) in zip(axes, families, strict=True):
        for ax, (key, label, factor) in zip(row, _SAMPLE_PANELS, strict=True):
            for p in members:
                points = [(r["samples"], factor * r[key]) for r in p.by_samples if key in r]
                line = style.line_style(p, inputs, colours)
                if len(points) == 1:
                    ax.axhline(points[0][1], label=p.name, **line)
                elif points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, marker=".", ms=3, label=p.name, **line)
            ax.set(ylabel=label)
            ax.set_title(f"{title}: {label}", fontsize="medium")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        style.row_legend(row[-1])
    for ax in axes[-1]:
        ax.set_xlabel("samples in the average")
    return fig


CAPTION = (
    "Test NLL, accuracy and ECE of the Bayesian model average against the number of "
    "samples averaged, one row per family; the baseline (grey, dotted) in every row, "
    "F-variants dashed in their reference's colour. A single-sample predictor is a "
    "horizontal line; a family of single networks only (temperature-scaled MAP) has no row."
)


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    return Section(figure_section("samples", style.png_or_none(samples_layout(inputs)), CAPTION))
