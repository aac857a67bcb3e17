"""Calibration: accuracy - confidence per confidence bin, one panel per family, and the
classic accuracy-vs-confidence bars of the main predictors (ALGORITHMS §7); then
calibration done right (ALGORITHMS §11): equal-width, adaptive and classwise ECE, each
predictor's metrics at its own temperature fitted on validation, the ranking by
calibrated NLL, which comparisons with the baseline survive calibration, and the
deep-ensemble equivalent (Ashukha et al. 2020)."""

from __future__ import annotations

import math
from collections.abc import Callable

from matplotlib.figure import Figure

from ...evaluation.calibrated import dee_text, deep_ensemble_equivalent
from .. import style
from ..blocks import (
    Block,
    Cell,
    Heading,
    Paragraph,
    Section,
    Table,
    TableBlock,
    figure_section,
)
from ..claims import Claim
from ..formats import fmt_value, with_interval
from ..inputs import PredictorResult, ReportInputs
from ..uncertainty import Uncertainty, temperature_of

CALIBRATION_PAPER = "Calibrated comparison (Ashukha et al. 2020)"


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
    "its reference. A bin of a few points swings widely: in a bin of 4, one image more or "
    "less moves it by 25 points (the counts: plots/reliability/<trajectory>/<predictor>.csv)."
)


def classic_reliability(inputs: ReportInputs) -> Figure | None:
    """The classic reliability diagram (Guo et al. 2017) of the main predictors, a panel
    each: per non-empty bin a bar of its accuracy over the bin's width and, from it to the
    bin's mean confidence, the gap; the diagonal is perfect calibration. None without bins."""
    chosen = [
        (p, bins)
        for p in style.main_predictors(inputs)
        if (bins := [r for r in p.reliability if r.get("count", 0) > 0 and "lower" in r])
    ]
    if not chosen:
        return None
    cols = min(5, len(chosen))
    rows = math.ceil(len(chosen) / cols)
    fig, axes = style.grid(rows, cols, 2.6 * cols, 2.6)
    for ax, (p, bins) in zip(axes.ravel(), chosen, strict=False):
        left = [r["lower"] for r in bins]
        width = [r["upper"] - r["lower"] for r in bins]
        acc = [r["accuracy"] for r in bins]
        gap = [r["confidence"] - r["accuracy"] for r in bins]
        ax.bar(left, acc, width, align="edge", color="tab:blue", edgecolor="k", lw=0.4)
        ax.bar(
            left,
            gap,
            width,
            bottom=acc,
            align="edge",
            facecolor="none",  # hatched only: where it overlaps the blue bar, both show
            edgecolor="tab:red",
            hatch="///",
            lw=0.6,
        )
        ax.plot([0, 1], [0, 1], color="0.3", ls="--", lw=0.8)
        ece = p.metric("ece")
        title = p.name + (f"  ECE {ece:.3f}" if math.isfinite(ece) else "")
        ax.set(xlim=(0, 1), ylim=(0, 1), title=title, xlabel="confidence", ylabel="accuracy")
        ax.set_aspect("equal")
    for ax in axes.ravel()[len(chosen) :]:
        ax.set_axis_off()
    return fig


CLASSIC_CAPTION = (
    "Reliability diagrams of the baseline and the main predictors (the classic style): "
    "per confidence bin with test points (20 equal-width bins), a blue bar of the bin's "
    "accuracy and, hatched red, the gap from it to the bin's mean confidence: above the "
    "blue bar over-confident in that bin, inside it under-confident. The dashed diagonal "
    "is perfect calibration; the title gives each predictor's ECE. A bin of a few points "
    "swings widely (the counts: plots/reliability/<trajectory>/<predictor>.csv)."
)


def ensemble_curve(inputs: ReportInputs) -> tuple[str, list[float]] | None:
    """The deep ensemble's calibrated test NLL at 1..M members (its ``by_samples``
    column ``nll_calibrated``): the first predictor of method ``ensemble`` that has it."""
    for p in inputs.predictors:
        if p.method != "ensemble" or not p.by_samples:
            continue
        values = [row.get("nll_calibrated") for row in p.by_samples]
        if all(isinstance(v, int | float) for v in values):
            return p.name, [float(v) for v in values]  # type: ignore[arg-type]
    return None


def _calibrated(p: PredictorResult, key: str) -> float:
    found = p.metrics.get("calibrated")
    value = found.get(key) if isinstance(found, dict) else None
    return float(value) if isinstance(value, int | float) else math.nan


def _verdict(unc: Uncertainty, base: str, name: str, calibrated: bool) -> str:
    if name == base:
        return "baseline"
    if calibrated:
        iv = unc.calibrated_vs_baseline.get(name)
    else:
        comp = unc.comparison(base, name)
        iv = comp.intervals["nll"] if comp is not None else None
    return "n/a" if iv is None else iv.verdict()


def calibrated_table(inputs: ReportInputs, unc: Uncertainty) -> Table:
    """Per predictor: the four ECEs, T, calibrated NLL/ECE/Brier, DEE, and the NLL
    verdict against the baseline before and after calibration."""
    base = inputs.baseline
    curve = ensemble_curve(inputs)
    header = [
        "Predictor",
        "ECE [95% CI]",
        "ECE (15 bins)",
        "adaptive ECE",
        "classwise ECE",
        "T (val)",
        "calibrated NLL [95% CI]",
        "calibrated ECE",
        "calibrated Brier",
        "DEE",
        f"NLL vs {base}: raw → calibrated",
    ]
    rows = []
    for p in inputs.predictors:
        t = temperature_of(p)
        cal = unc.calibrated.get(p.name, {})
        nll = _calibrated(p, "nll")
        dee = deep_ensemble_equivalent(nll, curve[1]) if curve is not None else math.nan
        raw, after = _verdict(unc, base, p.name, False), _verdict(unc, base, p.name, True)
        changed = raw != after and p.name != base
        rows.append(
            [
                Cell(p.name),
                Cell(with_interval("ece", p.metric("ece"), unc.estimate(p.name, "ece"))),
                Cell(fmt_value("ece", p.metric("ece15"))),
                Cell(fmt_value("ece", p.metric("ece_adaptive"))),
                Cell(fmt_value("ece", p.metric("ece_classwise"))),
                Cell(f"{t:.3f}" if t is not None else "n/a"),
                Cell(with_interval("nll", nll, cal.get("nll"))),
                Cell(fmt_value("ece", _calibrated(p, "ece"))),
                Cell(fmt_value("brier", _calibrated(p, "brier"))),
                Cell(dee_text(dee, len(curve[1])) if curve is not None else "n/a"),
                Cell(raw if p.name == base else f"{raw} → {after}", changed),
            ]
        )
    return Table(header, rows)


def _ranks(
    predictors: list[PredictorResult], value: Callable[[PredictorResult], float]
) -> dict[str, int]:
    found = [p for p in predictors if math.isfinite(value(p))]
    return {p.name: i for i, p in enumerate(sorted(found, key=value), start=1)}


def ranking_changes(inputs: ReportInputs) -> list[tuple[str, int, int]]:
    """(predictor, rank by NLL, rank by calibrated NLL) where the two differ."""
    ps = [p for p in inputs.predictors if math.isfinite(_calibrated(p, "nll"))]
    raw = _ranks(ps, lambda p: p.metric("nll"))
    cal = _ranks(ps, lambda p: _calibrated(p, "nll"))
    return [(name, raw[name], cal[name]) for name in raw if raw[name] != cal.get(name)]


def calibration_claim(inputs: ReportInputs, unc: Uncertainty) -> Claim | None:
    """Whether every NLL comparison with the baseline keeps its verdict at the
    predictors' own temperatures (None without calibrated comparisons)."""
    base = inputs.baseline
    pairs = [
        (p.name, _verdict(unc, base, p.name, False), _verdict(unc, base, p.name, True))
        for p in inputs.predictors
        if p.name != base and p.name in unc.calibrated_vs_baseline
    ]
    if not pairs:
        return None
    flipped = [f"{n} ({a} → {b})" for n, a, b in pairs if a != b]
    kept = sum(a == b for _, a, b in pairs)
    evidence = (
        f"{kept} of {len(pairs)} NLL comparisons with {base} keep their verdict after each "
        "predictor (the baseline too) is tempered by its own T fitted on validation"
        + (f"; changed: {', '.join(flipped)}." if flipped else ".")
    )
    return Claim(
        CALIBRATION_PAPER,
        f"the NLL comparisons with {base} survive calibration",
        not flipped,
        evidence,
        f"{kept}/{len(pairs)} kept",
    )


def calibration_blocks(inputs: ReportInputs, unc: Uncertainty) -> list[Block]:
    if not any(temperature_of(p) is not None for p in inputs.predictors):
        return []
    curve = ensemble_curve(inputs)
    changes = ranking_changes(inputs)
    moved = ", ".join(f"{n} {a} → {b}" for n, a, b in changes)
    text = (
        "Each predictor's averaged predictive tempered by its own temperature T, fitted on "
        "the validation split (NLL, golden-section search), then scored on the test split: "
        "what remains is what one scalar cannot fix. The calibrated metrics' intervals "
        "hold T fixed. ECE: 20 equal-width bins (its interval bias-corrected), and 15 as "
        "the libraries bin (torchmetrics' default); adaptive: 20 equal-mass bins; "
        "classwise: the mean over classes of each class probability's ECE. "
        + (
            f"Ranked by calibrated NLL instead of NLL, these move: {moved}."
            if changes
            else "The ranking by calibrated NLL is the ranking by NLL."
        )
    )
    if curve is not None:
        name, values = curve
        text += (
            f" DEE: the number of {name} members (interpolated) whose calibrated NLL "
            f"equals the predictor's ({', '.join(f'{v:.4f}' for v in values)} at 1.."
            f"{len(values)} members); '< 1' is worse than one network, '> {len(values)}' "
            "better than the whole ensemble."
        )
    return [
        Heading(2, "Calibration done right"),
        Paragraph(text),
        TableBlock(calibrated_table(inputs, unc)),
    ]


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    claim = calibration_claim(inputs, unc)
    return Section(
        figure_section("reliability", style.png_or_none(reliability_layout(inputs)), CAPTION)
        + figure_section(
            "reliability_classic",
            style.png_or_none(classic_reliability(inputs)),
            CLASSIC_CAPTION,
        )
        + calibration_blocks(inputs, unc),
        [claim] if claim is not None else [],
    )
