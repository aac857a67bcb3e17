"""Sharpness and calibration: do flatter predictors calibrate better? Spearman's rank
correlation of SAM sharpness and tr(H) with ECE and NLL over the predictors.

Predictors measured at one network (map and laplace at the fine-tuned weights; swa,
swag_diag and swag at the snapshot mean) share its sharpness: they are one unit, not
independent points, and the permutation test moves them together
(``stats.clustered_permutation_p``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .. import style
from ..blocks import (
    Block,
    Cell,
    Heading,
    Paragraph,
    Section,
    Table,
    TableBlock,
    claim_bullets,
    figure,
)
from ..claims import FLAT_PAPER, Claim
from ..inputs import PredictorResult, ReportInputs
from ..stats import clustered_permutation_p, spearman
from ..uncertainty import Uncertainty

# |rho| below this is trivially small, whatever its p-value.
MIN_RHO = 0.3


SHARPNESS_AXES = (
    ("hessian_trace", "tr(H) (log scale)"),
    ("sharpness", "SAM sharpness (log scale)"),
)


CALIBRATION_AXES = (("nll", "test NLL"), ("ece", "test ECE"))


@dataclass(frozen=True)
class Correlation:
    x: str
    y: str
    rho: float
    p: float
    n: int
    networks: int  # distinct values of x: the units the permutation test shuffles


CAPTIONS = {
    "analysis_sharpness": (
        "Test NLL (top) and ECE (bottom) against tr(H) (left) and the SAM "
        "sharpness (right), log x axes; one point per predictor, open for flat-seeking variants. "
        "The title gives Spearman's rank correlation over the predictors shown."
    ),
}


def correlation(predictors: list[PredictorResult], x: str, y: str) -> Correlation | None:
    """Spearman's rho of metric x against y over the predictors that have both (x > 0)."""
    pairs = [
        (p.metric(x), p.metric(y))
        for p in predictors
        if p.metric(x) > 0 and math.isfinite(p.metric(x)) and math.isfinite(p.metric(y))
    ]
    if len(pairs) < 3:
        return None
    xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
    rho = spearman(xs, ys)
    if not math.isfinite(rho):
        return None
    p = clustered_permutation_p(xs, ys)
    return Correlation(x, y, rho, p, len(pairs), len(set(xs)))


def flat_calibrated_verdict(found: list[Correlation]) -> bool | None:
    """True: every rho with ECE and NLL is >= MIN_RHO with p < 0.05; False: none is
    positive; None: mixed, small or within noise."""
    if not found:
        return None
    if all(c.rho >= MIN_RHO and c.p < 0.05 for c in found):
        return True
    if all(c.rho <= 0 for c in found):
        return False
    return None


def sharpness_correlations(inputs: ReportInputs, x: str) -> list[Correlation]:
    found = [correlation(inputs.predictors, x, y) for y in ("ece", "nll")]
    return [c for c in found if c is not None]


def _sharp_points(inputs: ReportInputs, x: str, y: str) -> list[PredictorResult]:
    return [
        p for p in inputs.predictors if 0 < p.metric(x) < math.inf and math.isfinite(p.metric(y))
    ]


def sharpness_figure(inputs: ReportInputs) -> Figure | None:
    """NLL and ECE against tr(H) and SAM sharpness, a labelled point per predictor."""
    if not any(_sharp_points(inputs, x, "nll") for x, _ in SHARPNESS_AXES):
        return None
    colours = style.colours(inputs)
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(2, 2, squeeze=False)
    for j, (x, xlabel) in enumerate(SHARPNESS_AXES):
        for i, (y, ylabel) in enumerate(CALIBRATION_AXES):
            ax = axes[i][j]
            points = _sharp_points(inputs, x, y)
            for p in points:
                flat = style.linestyle(p, inputs) == "--"
                colour = colours.get(p.name, "k")
                ax.scatter(
                    p.metric(x),
                    p.metric(y),
                    s=30,
                    color="none" if flat else colour,
                    edgecolors=colour,
                )
                ax.annotate(
                    p.name,
                    (p.metric(x), p.metric(y)),
                    xytext=(3, 3),
                    textcoords="offset points",
                    fontsize="x-small",
                )
            corr = correlation(inputs.predictors, x, y)
            title = (
                rf"Spearman $\rho$ = {corr.rho:+.2f} (n = {corr.n})" if corr else "too few points"
            )
            if points:
                ax.set_xscale("log")
                ax.margins(x=0.15, y=0.08)
            ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
            ax.grid(alpha=0.3)
    handles = [
        Line2D([], [], marker="o", linestyle="", color="0.3", label="averaging / single network"),
        Line2D(
            [],
            [],
            marker="o",
            linestyle="",
            color="0.3",
            markerfacecolor="none",
            label="flat-seeking (SAM) variant",
        ),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize="small")
    return fig


def _deciding(found: list[Correlation], holds: bool | None) -> Correlation:
    """The correlation that decides the rule: the weakest when it holds, the strongest when
    it fails (none positive), else the first that misses the bar."""
    if holds is True:
        return min(found, key=lambda c: c.rho)
    if holds is False:
        return max(found, key=lambda c: c.rho)
    return next(c for c in found if not (c.rho >= MIN_RHO and c.p < 0.05))


def claims(inputs: ReportInputs) -> list[Claim]:
    out = []
    for x, label in (("sharpness", "SAM sharpness"), ("hessian_trace", "tr(H)")):
        statement = f"Flatter is better calibrated: lower {label} goes with lower ECE and NLL"
        found = sharpness_correlations(inputs, x)
        if not found:
            why = f"Fewer than 3 predictors have {label}."
            out.append(Claim(FLAT_PAPER, statement, None, why, "n/a (fewer than 3 predictors)"))
            continue
        parts = "; ".join(
            f"rho({label}, {c.y.upper()}) = {c.rho:+.2f} (one-sided permutation p = {c.p:.3f})"
            for c in found
        )
        text = (
            f"Spearman over n = {found[0].n} predictors measured at {found[0].networks} "
            "networks (small: ranks move with one predictor; the permutation test shuffles "
            f"the {label} among the networks, each network's predictors together): {parts}. "
            f"Rule: holds if every rho ≥ {MIN_RHO:g} with p < 0.05, fails if none is positive."
        )
        holds = flat_calibrated_verdict(found)
        c = _deciding(found, holds)
        number = (
            f"rho({label}, {c.y.upper()}) {c.rho:+.2f}, p {c.p:.3f}, n {c.n} at "
            f"{c.networks} networks"
        )
        out.append(Claim(FLAT_PAPER, statement, holds, text, number))
    return out


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    checked = claims(inputs)
    blocks: list[Block] = [Heading(2, "Sharpness and calibration")]
    found = [c for x in ("sharpness", "hessian_trace") for c in sharpness_correlations(inputs, x)]
    if not found:
        empty = Paragraph("Fewer than 3 predictors have sharpness and tr(H); nothing to show.")
        return Section([*blocks, empty], checked)
    strongest = max(found, key=lambda c: (abs(c.rho), c.x, c.y))
    blocks += [
        Paragraph(
            f"The strongest rank correlation is between {strongest.x} and {strongest.y.upper()} "
            f"(rho = {strongest.rho:+.2f} over {strongest.n} predictors at {strongest.networks} "
            "networks: predictors measured at one network, such as swa, swag_diag and swag at "
            "the snapshot mean, share its sharpness, and the permutation test moves them "
            "together)."
        ),
        *figure(
            "analysis_sharpness",
            style.png_or_none(sharpness_figure(inputs)),
            CAPTIONS["analysis_sharpness"],
        ),
        TableBlock(
            Table(
                [
                    "Sharpness",
                    "Metric",
                    "Spearman rho",
                    "Permutation p (rho ≥ observed)",
                    "Predictors (networks)",
                ],
                [
                    [
                        Cell(c.x),
                        Cell(c.y),
                        Cell(f"{c.rho:+.3f}"),
                        Cell(f"{c.p:.3f}"),
                        Cell(f"{c.n} ({c.networks})"),
                    ]
                    for c in found
                ],
            )
        ),
    ]
    return Section([*blocks, claim_bullets(checked)], checked)
