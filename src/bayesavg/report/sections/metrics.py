"""Metrics: every predictor's test metrics with their intervals, then sharpness and tr(H)."""

from __future__ import annotations

import math

from ...config.methods import REGISTRY
from ..blocks import (
    Block,
    Cell,
    Heading,
    Paragraph,
    Section,
    Table,
    TableBlock,
)
from ..formats import fmt_or_dash, with_interval
from ..inputs import PredictorResult, ReportInputs
from ..intervals import LOWER_IS_BETTER
from ..uncertainty import Uncertainty

# (metric key, column header) of the metrics table; each cell carries its interval.
_COLUMNS = [
    ("accuracy", "Accuracy (%)"),
    ("nll", "NLL"),
    ("ece", "ECE (20 bins)"),
    ("brier", "Brier"),
]


def _scale(p: PredictorResult) -> str:
    """The covariance scale where the method has one ('-' where a scale would change
    nothing: for VI or an ensemble a 0 would read as 'no variance')."""
    method = REGISTRY.get(p.method)
    return f"{p.scale:g}" if method is None or method.has_scale else "-"


GEOMETRY_NOTE = (
    "Sharpness (the SAM loss increase) and the Hessian trace tr(H) of each predictor's "
    "weights: properties of the network, not averages over test points, so they carry no "
    "bootstrap interval. tr(H) is Hutchinson's estimate, the mean of v^T H v over a few "
    "random sign vectors v; ± is its standard error over them (the estimate's own noise)."
)


def metrics_table(predictors: list[PredictorResult], unc: Uncertainty) -> Table:
    """Every metric with its 95% interval where predictions exist; the best value bold.

    The method is in the setup paragraph; leaving it out keeps four intervals on a line.
    """
    best = {}
    for key, _ in _COLUMNS:
        values = [v for p in predictors if math.isfinite(v := p.metric(key))]
        higher = not LOWER_IS_BETTER[key]
        best[key] = (max if higher else min)(values) if values else None
    header = ["Predictor", "Trajectory", "Scale", *(h for _, h in _COLUMNS), "Samples"]
    rows = []
    for p in predictors:
        row = [Cell(p.name), Cell(p.trajectory), Cell(_scale(p))]
        for key, _ in _COLUMNS:
            v = p.metric(key)
            text = with_interval(key, v, unc.estimate(p.name, key))
            row.append(Cell(text, math.isfinite(v) and v == best[key]))
        n = p.metric("n_samples")
        row.append(Cell(f"{n:g}" if math.isfinite(n) else "n/a"))
        rows.append(row)
    return Table(header, rows)


def metrics_note(predictors: list[PredictorResult], unc: Uncertainty) -> str:
    """How to read the metrics table, and which predictors have no interval and why."""
    s = unc.settings
    text = (
        f"Each metric on the test split with its {100 * s.level:g}% percentile bootstrap "
        f"interval in brackets ({s.resamples} resamples of the test points, seed {s.seed}); "
        "ECE's interval is bias-corrected (the percentile interval shifted by the "
        "resamples' median bias: binned ECE's bootstrap sits above the point, "
        "ALGORITHMS §10), so every value lies inside its own interval. "
        "Bold: the best value of the column, not necessarily better beyond noise (see "
        "Comparisons)."
    )
    missing = [p.name for p in predictors if not unc.estimates.get(p.name)]
    if missing:
        text += (
            f" No interval for {', '.join(missing)}: their per-point predictions "
            "(predictions/<name>.npz) were not given, so only the value is shown."
        )
    return text


def geometry_table(predictors: list[PredictorResult]) -> Table | None:
    """Sharpness and tr(H): properties of the weights, not of test points, so no interval;
    tr(H) with its standard error over Hutchinson's probes where there is one."""
    rows = [
        [Cell(p.name), Cell(fmt_or_dash(p.metric("sharpness"), ".4f", "n/a")), _trace_cell(p)]
        for p in predictors
        if math.isfinite(p.metric("sharpness")) or math.isfinite(p.metric("hessian_trace"))
    ]
    return Table(["Predictor", "Sharpness (SAM)", "tr(H)"], rows) if rows else None


def _trace_cell(p: PredictorResult) -> Cell:
    value, se = p.metric("hessian_trace"), p.metric("hessian_trace_se")
    text = fmt_or_dash(value, ".4g", "n/a")
    return Cell(f"{text} ± {se:.2g}" if math.isfinite(value) and math.isfinite(se) else text)


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    blocks: list[Block] = [
        Heading(2, "Metrics"),
        Paragraph(metrics_note(inputs.predictors, unc)),
        TableBlock(metrics_table(inputs.predictors, unc)),
    ]
    geometry = geometry_table(inputs.predictors)
    if geometry is not None:
        blocks += [Paragraph(GEOMETRY_NOTE), TableBlock(geometry)]
    return Section(blocks)
