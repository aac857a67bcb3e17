"""CIFAR-10-C (Hendrycks & Dietterich 2019): accuracy, NLL and ECE averaged over the
corruptions at each severity and over all of them (the papers' "corrupted" metrics), per
predictor, and whether the images were the benchmark's published arrays or generated."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from .. import style
from ..blocks import Block, Cell, Heading, Paragraph, Section, Table, TableBlock, figure
from ..formats import fmt_value
from ..inputs import PredictorResult, ReportInputs
from ..uncertainty import Uncertainty

PREFIX = "c_"
KEYS = (("accuracy", "accuracy (%)"), ("nll", "NLL"), ("ece", "ECE"))
CAPTION = (
    "CIFAR-10-C: each metric averaged over the corruptions at each severity (0: the clean "
    "test split), for the baseline (grey, dotted) and one predictor per family."
)


def by_severity(p: PredictorResult) -> dict[int, dict[str, list[float]]]:
    """Severity -> metric -> its values over the corruptions (``shift.c_<name>_<level>``)."""
    shift = p.metrics.get("shift")
    out: dict[int, dict[str, list[float]]] = {}
    for name, row in (shift if isinstance(shift, dict) else {}).items():
        level = name.rpartition("_")[2]
        if not (
            name.startswith(PREFIX)
            and level.isascii()
            and level.isdigit()
            and isinstance(row, dict)
        ):
            continue
        found = out.setdefault(int(level), {k: [] for k, _ in KEYS})
        for key, _ in KEYS:
            value = row.get(key)
            found[key].append(float(value) if isinstance(value, int | float) else math.nan)
    return dict(sorted(out.items()))


def corrupted(p: PredictorResult, key: str) -> float:
    """The mean of ``key`` over every corruption and severity (NaN without any)."""
    values = [v for row in by_severity(p).values() for v in row[key]]
    return float(np.mean(values)) if values else math.nan


def table(inputs: ReportInputs, severities: list[int]) -> Table:
    header = ["Predictor", *(f"corrupted {label}" for _, label in KEYS)]
    header += [f"NLL, severity {s}" for s in severities]
    rows = []
    for p in inputs.predictors:
        levels = by_severity(p)
        row = [Cell(p.name), *(Cell(fmt_value(k, corrupted(p, k))) for k, _ in KEYS)]
        for s in severities:
            values = levels.get(s, {}).get("nll", [])
            row.append(Cell(fmt_value("nll", float(np.mean(values)) if values else math.nan)))
        rows.append(row)
    return Table(header, rows)


def curves(inputs: ReportInputs) -> Figure | None:
    chosen = [p for p in style.main_predictors(inputs) if by_severity(p)] or [
        p for p in inputs.predictors if by_severity(p)
    ][:1]
    if not chosen:
        return None
    colours = style.colours(inputs)
    fig, axes = style.grid(1, len(KEYS), 13.0, 3.2)
    for ax, (key, label) in zip(axes[0], KEYS, strict=True):
        scale = 100.0 if key == "accuracy" else 1.0
        for p in chosen:
            levels = by_severity(p)
            xs = [0, *levels]
            ys = [p.metric(key), *(float(np.mean(levels[s][key])) for s in levels)]
            ax.plot(
                xs,
                [scale * y for y in ys],
                marker="o",
                ms=3,
                label=p.name,
                **style.line_style(p, inputs, colours),
            )
        ax.set(xlabel="severity (0: clean)", ylabel=label, xticks=range(6))
        ax.grid(alpha=0.3)
    style.row_legend(axes[0][-1])
    return fig


def source(inputs: ReportInputs) -> str:
    """Where the corrupted images came from, from the evaluate stages' records."""
    listed = {n for p in inputs.predictors for n in p.metrics.get("shift", {}) or {}}
    total = sorted(n for n in listed if n.startswith(PREFIX))
    official = {n for p in inputs.predictors for n in p.metrics.get("cifar_c_official", []) or []}
    if official and len(official) == len(total):
        return "the benchmark's published arrays (CIFAR-10-C / CIFAR-100-C from data/raw)"
    generated = (
        "generated with the benchmark's CIFAR parameters (bayesavg.data.cifar_c): they match "
        "the published arrays in distribution, not pixel for pixel, and frost uses a "
        "synthetic texture; put the official arrays in data/raw to report the benchmark"
    )
    if official:
        return f"the published arrays for {len(official)} of {len(total)}, the rest {generated}"
    return generated


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    severities = sorted({s for p in inputs.predictors for s in by_severity(p)})
    if not severities:
        return Section([])
    names = {
        n.rpartition("_")[0]
        for p in inputs.predictors
        for n in p.metrics.get("shift", {}) or {}
        if n.startswith(PREFIX)
    }
    text = (
        f"{len(names)} corruptions at severities {', '.join(map(str, severities))} of the "
        f"shifted test subset; images {source(inputs)}. 'Corrupted' metrics average over "
        "every corruption and severity, as the papers report them."
    )
    blocks: list[Block] = [
        Heading(2, "CIFAR-10-C"),
        Paragraph(text),
        *figure("cifar_c", style.png_or_none(curves(inputs)), CAPTION),
        TableBlock(table(inputs, severities)),
    ]
    return Section(blocks)
