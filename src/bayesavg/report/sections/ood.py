"""Out-of-distribution detection: AUROC, AUPR and FPR95 of three uncertainty scores per
OOD set, and whether the Bayesian predictors detect OOD inputs better than the baseline."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .. import style
from ..auroc_intervals import AurocInterval, paired_aurocs
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
from ..claims import BMA_PAPER, Claim
from ..formats import fmt_or_dash
from ..inputs import PredictorResult, ReportInputs, is_bayesian, is_closed_form
from ..uncertainty import Uncertainty, per_inputs, settings

OOD_SCORES = (
    ("msp", "1 - max p"),
    ("entropy", "H[p̄]"),
    ("mutual_info", "MI"),
)


OOD_KEYS = (
    ("auroc", "AUROC"),
    ("aupr_in", "AUPR-In"),
    ("aupr_out", "AUPR-Out"),
    ("fpr95", "FPR95"),
)


MAX_HISTOGRAMS = 8

CAPTIONS = {
    "analysis_ood": (
        "Entropy H[p̄] of the BMA prediction on the test split and on the OOD set "
        "(density, log scale) for the baseline and one predictor per family; the title gives the "
        "AUROC of the entropy score (OOD the positive class)."
    ),
}


def ood_metrics(p: PredictorResult) -> dict[str, dict[str, dict[str, float]]]:
    ood = p.metrics.get("ood")
    return ood if isinstance(ood, dict) else {}


def ood_sets(inputs: ReportInputs) -> list[str]:
    """Every OOD set any predictor was scored on, sorted."""
    return sorted({s for p in inputs.predictors for s in ood_metrics(p)})


def ood_value(p: PredictorResult, ood_set: str, score: str, key: str) -> float:
    value = ood_metrics(p).get(ood_set, {}).get(score, {}).get(key)
    return float(value) if isinstance(value, int | float) else math.nan


def ood_counts(p: PredictorResult, ood_set: str) -> tuple[int, int] | None:
    """(in-distribution, OOD) points behind the predictor's OOD scores, when known."""
    pred = p.predictions
    if pred is None:
        return None
    test = pred.ood_scores.get("test", {}).get("entropy")
    ood = pred.ood_scores.get(ood_set, {}).get("entropy")
    if test is None or ood is None:
        return None
    return len(test), len(ood)


def entropy_points(p: PredictorResult, ood_set: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The predictor's per-point H[p̄] on the test split and on the OOD set, when written."""
    scores = p.predictions.ood_scores if p.predictions is not None else {}
    test = scores.get("test", {}).get("entropy")
    ood = scores.get(ood_set, {}).get("entropy")
    return None if test is None or ood is None else (test, ood)


@per_inputs
def auroc_vs_baseline(inputs: ReportInputs) -> dict[str, AurocInterval]:
    """Each predictor's AUROC of H[p̄] against the baseline's on the first OOD set: a
    paired, stratified bootstrap over the test and OOD points (ALGORITHMS §10), the
    baseline's resamples drawn once for all. Only predictors scored on the baseline's
    points are compared; computed once per inputs (the headline and the section ask)."""
    ood_set, base = _first_ood_set(inputs), style.baseline(inputs)
    ref = entropy_points(base, ood_set) if base is not None and ood_set is not None else None
    if ref is None or ood_set is None:
        return {}
    sizes = (len(ref[0]), len(ref[1]))
    candidates = {
        p.name: found
        for p in inputs.predictors
        if p is not base
        and (found := entropy_points(p, ood_set)) is not None
        and (len(found[0]), len(found[1])) == sizes
    }
    s = settings(inputs.params)
    return paired_aurocs(ref, candidates, s.resamples, s.seed, s.level)


def _first_ood_set(inputs: ReportInputs) -> str | None:
    sets = ood_sets(inputs)
    return "animal_mnist" if "animal_mnist" in sets else (sets[0] if sets else None)


def _representatives(inputs: ReportInputs, ood_set: str) -> list[PredictorResult]:
    """The baseline and the first predictor of each family with per-point entropies,
    an averaging one where the family has it (SWAG before SWA)."""

    def has(p: PredictorResult | None) -> bool:
        return p is not None and ood_counts(p, ood_set) is not None

    base = style.baseline(inputs)
    chosen = [base] if has(base) else []
    for ps in style.families(inputs).values():
        ranked = sorted(ps, key=lambda p: not is_bayesian(p))
        first = next((p for p in ranked if has(p)), None)
        if first is not None:
            chosen.append(first)
    return chosen[:MAX_HISTOGRAMS]


def ood_histogram_figure(inputs: ReportInputs, ood_set: str) -> Figure | None:
    """H[p̄] on the test split and on the OOD set, one panel per representative predictor."""
    chosen = _representatives(inputs, ood_set)
    if not chosen:
        return None
    scores = [(p, p.predictions.ood_scores) for p in chosen if p.predictions is not None]
    top = max(
        float(np.max(s[k]["entropy"]))
        for _, s in scores
        for k in ("test", ood_set)
        if len(s[k]["entropy"])
    )
    bins = np.linspace(0.0, max(top, 1e-6), 31)
    cols = min(4, len(scores))
    fig = Figure(layout="constrained")
    axes = style.series_axes(
        fig, math.ceil(len(scores) / cols), cols, width=3.2, height=2.5
    ).ravel()
    for ax, (p, s) in zip(axes, scores, strict=False):
        ax.hist(s["test"]["entropy"], bins=bins, density=True, alpha=0.6, color=style.TAB10[0])
        ax.hist(s[ood_set]["entropy"], bins=bins, density=True, alpha=0.6, color=style.TAB10[3])
        auroc = ood_value(p, ood_set, "entropy", "auroc")
        ax.set_title(f"{p.name} (AUROC {auroc:.3f})", fontsize="medium")
        ax.set_yscale("log")
        ax.set_xlabel("H[p̄] (nats)")
    for ax in axes[len(scores) :]:
        ax.set_axis_off()
    fig.supylabel("density (log scale)")
    handles = [
        Patch(color=style.TAB10[0], alpha=0.6, label="test (in-distribution)"),
        Patch(color=style.TAB10[3], alpha=0.6, label=f"{ood_set} (OOD)"),
    ]
    fig.legend(handles=handles, loc="outside upper center", ncols=2, fontsize="small")
    return fig


def _ood_claim(inputs: ReportInputs) -> Claim:
    statement = "Bayesian predictors detect OOD inputs better than the baseline (AUROC of H[p̄])"
    ood_set, base = _first_ood_set(inputs), style.baseline(inputs)
    if ood_set is None or base is None or math.isnan(ood_value(base, ood_set, "entropy", "auroc")):
        return Claim(
            BMA_PAPER, statement, None, "No OOD metrics for the baseline.", "n/a (no OOD metrics)"
        )
    ref = ood_value(base, ood_set, "entropy", "auroc")
    intervals = auroc_vs_baseline(inputs)
    higher, lower, no_interval, n = [], [], [], 0
    for p in inputs.predictors:
        value = ood_value(p, ood_set, "entropy", "auroc")
        if p.name == base.name or not is_bayesian(p) or math.isnan(value):
            continue
        n += 1
        interval = intervals.get(p.name)
        if interval is None:
            no_interval.append(p.name)
        elif interval.verdict() == "higher":
            higher.append(p.name)
        elif interval.verdict() == "lower":
            lower.append(p.name)
    if n == 0:
        why = "No Bayesian predictor has OOD metrics."
        return Claim(BMA_PAPER, statement, None, why, "n/a (no Bayesian OOD metrics)")
    if len(no_interval) == n:
        why = (
            f"On {ood_set}, {base.name}'s AUROC is {ref:.4f}, but no Bayesian predictor has "
            "per-point scores on the baseline's points, so no interval decides."
        )
        return Claim(BMA_PAPER, statement, None, why, f"no interval (of {n}) vs AUROC {ref:.4f}")
    holds = True if len(higher) > n / 2 else (False if len(higher) <= len(lower) else None)
    level = settings(inputs.params).level
    text = (
        f"On {ood_set}, {base.name}'s AUROC is {ref:.4f}; of {n} Bayesian predictors, "
        f"{len(higher)} are higher and {len(lower)} lower, by a {level:.0%} paired, stratified "
        "bootstrap interval of the AUROC difference (the same resamples of the test and of the "
        "OOD points for both predictors) that excludes 0"
        + (f" (lower: {', '.join(lower)})" if lower else "")
        + (
            f"; no per-point scores, so no interval: {', '.join(no_interval)}"
            if no_interval
            else ""
        )
        + "."
    )
    number = f"{len(higher)} higher, {len(lower)} lower of {n} vs AUROC {ref:.4f}"
    return Claim(BMA_PAPER, statement, holds, text, number)


def _ood_table(inputs: ReportInputs, ood_set: str, score: str) -> Table | None:
    rows = []
    for p in inputs.predictors:
        values = [ood_value(p, ood_set, score, k) for k, _ in OOD_KEYS]
        if all(math.isnan(v) for v in values):
            continue
        if score == "mutual_info" and (is_closed_form(p) or not is_bayesian(p)):
            why = "closed-form predictive: no samples" if is_bayesian(p) else "single network"
            rows.append([Cell(p.name)] + [Cell(f"- ({why}, so MI = 0)")] + [Cell("-")] * 3)
            continue
        rows.append([Cell(p.name)] + [Cell(fmt_or_dash(v)) for v in values])
    return Table(["Predictor", *(label for _, label in OOD_KEYS)], rows) if rows else None


def claims(inputs: ReportInputs) -> list[Claim]:
    """The section's claims without its figures (what the headline needs)."""
    return [_ood_claim(inputs)]


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    claim = _ood_claim(inputs)
    blocks: list[Block] = [Heading(2, "Out-of-distribution detection")]
    sets = ood_sets(inputs)
    if not sets:
        return Section(
            [*blocks, Paragraph("No predictor has OOD metrics; nothing to show.")], [claim]
        )
    blocks.append(
        Paragraph(
            "OOD is the positive class. Scores: 1 - max p̄ (max softmax probability), H[p̄] (entropy "
            "of the BMA prediction) and the mutual information H[p̄] - mean H[p_s] (0 for a single "
            "network, whose AUROC by MI is 0.5 by construction). FPR95: the share of test images "
            "flagged when 95% of the OOD images are. The claim below compares each predictor's "
            "AUROC with the baseline's by a paired, stratified bootstrap over the test and OOD "
            "points (each resampled on its own, the same resamples for both predictors)."
        )
    )
    for ood_set in sets:
        counts = next(filter(None, (ood_counts(p, ood_set) for p in inputs.predictors)), None)
        size = f" ({counts[0]} test, {counts[1]} OOD images)" if counts else ""
        for score, label in OOD_SCORES:
            table = _ood_table(inputs, ood_set, score)
            if table is not None:
                blocks += [Heading(3, f"{ood_set}{size}, score {label}"), TableBlock(table)]
    ood_set = _first_ood_set(inputs)
    png = style.png_or_none(ood_histogram_figure(inputs, ood_set) if ood_set else None)
    blocks += figure("analysis_ood", png, CAPTIONS["analysis_ood"])
    return Section([*blocks, claim_bullets([claim])], [claim])
