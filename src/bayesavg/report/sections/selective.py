"""Selective prediction: the error among the points a predictor keeps when it abstains on
its least confident ones (risk-coverage), AURC, AUGRC and the error at 90% and 95%
coverage, each with its interval and paired against the baseline (ALGORITHMS §11)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

from ...evaluation.selective import risk_coverage
from .. import style
from ..blocks import Block, Cell, Heading, Paragraph, Section, Table, TableBlock, figure
from ..formats import interval_text, with_interval
from ..inputs import PredictorResult, ReportInputs
from ..intervals import SELECTIVE
from ..uncertainty import Uncertainty

ZOOM = 0.8  # the right panel: where the curves part
CLIP = 0.1  # the left panel's y range: the risk of the first 10% of points is a few errors
HEADERS = {
    "aurc": "AURC",
    "augrc": "AUGRC",
    "risk_at_90": "error at 90% coverage",
    "risk_at_95": "error at 95% coverage",
}
CAPTION = (
    "Risk-coverage on the test split: the error rate among the points each predictor "
    "keeps when it abstains on the least confident (confidence = the largest averaged "
    "probability, ties by index), against the share kept. Lower is better; at coverage 1 "
    "every curve is the predictor's test error (the left panel's y range leaves out "
    "coverages below 0.1, where one error among a few points is a large rate). The "
    "baseline is grey and dotted; the "
    "main predictors (SWA, SWAG, MultiSWAG, the ensemble, Laplace, MC dropout, VI, HWA, "
    "SGLD) where present, each in a colour of its own."
)


def _curve(p: PredictorResult) -> tuple[np.ndarray, np.ndarray] | None:
    if p.predictions is None:
        return None
    lp = torch.as_tensor(np.asarray(p.predictions.log_probs, dtype=np.float64))
    y = torch.as_tensor(np.asarray(p.predictions.y, dtype=np.int64))
    coverage, risk = risk_coverage(lp, y)
    return coverage.numpy(), risk.numpy()


def _colours(chosen: list[PredictorResult], baseline: str) -> dict[str, Any]:
    """A colour of its own for each drawn predictor (families share colours elsewhere),
    the baseline grey."""
    palette = [c for i, c in enumerate(style.TAB10) if i != 7]  # tab10's 7th is grey
    others = [p.name for p in chosen if p.name != baseline]
    out: dict[str, Any] = {n: palette[i % len(palette)] for i, n in enumerate(others)}
    out[baseline] = style.BASELINE_COLOUR
    return out


def curves_figure(inputs: ReportInputs) -> Figure | None:
    """Risk-coverage of the main predictors, in full and zoomed on coverage ``ZOOM``-1."""
    chosen = [(p, c) for p in style.main_predictors(inputs) if (c := _curve(p)) is not None]
    if not chosen:
        return None
    colours = _colours([p for p, _ in chosen], inputs.baseline)
    fig, axes = style.grid(1, 2, 13.0, 3.6)
    for ax, low in zip(axes[0], (0.0, ZOOM), strict=True):
        for p, (coverage, risk) in chosen:
            ax.plot(
                coverage,
                100 * risk,
                label=p.name,
                color=colours[p.name],
                linestyle=style.linestyle(p, inputs),
                linewidth=1.2,
            )
        ax.set(xlim=(low, 1), xlabel="coverage (share of test points kept)")
        ax.set_ylabel("error among kept points (%)")
        ax.grid(alpha=0.3)
    for ax, low in zip(axes[0], (CLIP, ZOOM), strict=True):  # a few points' risk is noise
        top = max(100 * float(np.max(r[c >= low])) for _, (c, r) in chosen)
        ax.set_ylim(0, top * 1.05 + 1e-9)
    axes[0][0].set_title("all coverages")
    axes[0][1].set_title(f"coverage {ZOOM:g} to 1")
    style.row_legend(axes[0][1])
    return fig


def table(inputs: ReportInputs, unc: Uncertainty) -> Table:
    """Every predictor: each selective metric with its interval, and AURC against the
    baseline (paired)."""
    base = inputs.baseline
    header = ["Predictor", *HEADERS.values(), f"AURC - {base} [95% CI]", f"vs {base}"]
    rows = []
    for p in inputs.predictors:
        row = [Cell(p.name)]
        for key in SELECTIVE:
            row.append(Cell(with_interval(key, p.metric(key), unc.estimate(p.name, key))))
        comp = unc.comparison(base, p.name) if p.name != base else None
        if p.name == base:
            row += [Cell(""), Cell("baseline")]
        elif comp is None or "aurc" not in comp.intervals:
            row += [Cell("n/a"), Cell("no per-point predictions")]
        else:
            iv = comp.intervals["aurc"]
            verdict = iv.verdict()
            row += [
                Cell(interval_text(iv.diff, iv.low, iv.high)),
                Cell(verdict, verdict == "better"),
            ]
        rows.append(row)
    return Table(header, rows)


def summary(inputs: ReportInputs, unc: Uncertainty) -> str:
    """Which predictors abstain better than the baseline beyond noise, by AURC."""
    base = inputs.baseline
    better, worse = [], []
    for p in inputs.predictors:
        comp = unc.comparison(base, p.name) if p.name != base else None
        if comp is None or "aurc" not in comp.intervals:
            continue
        verdict = comp.intervals["aurc"].verdict()
        (better if verdict == "better" else worse if verdict == "worse" else []).append(p.name)
    found = [p for p in inputs.predictors if math.isfinite(p.metric("aurc"))]
    if not found:
        return "No predictor has selective-prediction metrics (evaluated before they existed)."
    best = min(found, key=lambda p: p.metric("aurc"))
    text = (
        f"Lowest AURC: {best.name} ({best.metric('aurc'):.4f}). By the paired interval of "
        f"the AURC difference, {len(better)} predictor(s) have a lower AURC than {base} "
        f"({', '.join(better) or 'none'}) and {len(worse)} a higher one "
        f"({', '.join(worse) or 'none'}); the rest are within noise. AURC mixes how often "
        "a predictor errs with how well it ranks its errors last; AUGRC (Traub et al. "
        "2024) weighs every coverage by the share of points kept."
    )
    return text


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    blocks: list[Block] = [
        Heading(2, "Selective prediction"),
        Paragraph(summary(inputs, unc)),
        *figure("risk_coverage", style.png_or_none(curves_figure(inputs)), CAPTION),
        TableBlock(table(inputs, unc)),
    ]
    return Section(blocks)
