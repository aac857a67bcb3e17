"""Dataset shift: test metrics on rotated and corrupted test images, and whether the
Bayesian predictors' NLL gap to the baseline grows with the rotation."""

from __future__ import annotations

import math

from ... import style
from ...blocks import (
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
from ...claims import BMA_PAPER, Claim
from ...formats import fmt_or_dash, interval_text, signed
from ...inputs import ReportInputs
from ...uncertainty import Uncertainty, per_inputs
from .figures import shift_figure, shift_gap_figure
from .measures import (
    LARGE_ANGLE,
    Range,
    ShiftGap,
    angles,
    corruption_summary,
    growth_verdict,
    large_gap,
    shift_gaps,
    shift_value,
)

CAPTIONS = {
    "analysis_shift": (
        "Test metrics on the rotated test subset against the rotation angle (0° is "
        "the clean subset), a row per family with the baseline (dotted grey) in each; F-variants "
        "dashed. Each metric has its own axis."
    ),
    "analysis_shift_gap": (
        "NLL of the baseline minus NLL of each Bayesian predictor per rotation "
        "angle (above 0: the predictor is better), with 95% paired-bootstrap intervals over the "
        "shifted test points where per-point predictions exist."
    ),
}


@per_inputs
def _shift_gaps(inputs: ReportInputs) -> list[ShiftGap]:
    """Paired bootstraps per Bayesian predictor and angle: drawn, claimed and tabled, so
    computed once per inputs."""
    base = style.baseline(inputs)
    return shift_gaps(inputs, base) if base is not None and angles(base) else []


def _shift_claim(inputs: ReportInputs, gaps: list[ShiftGap]) -> Claim:
    statement = (
        "Bayesian averaging helps most under shift: its NLL gap to the baseline grows with "
        "the rotation"
    )
    if not gaps:
        return Claim(
            BMA_PAPER,
            statement,
            None,
            "No rotation metrics for the baseline and a Bayesian predictor.",
            "n/a (no rotation metrics)",
        )
    best = min(gaps, key=lambda g: (-large_gap(g), g.predictor))
    zero = best.gap[0] if best.angles[0] == 0 else math.nan
    where = f"{best.predictor} (the largest mean gap at rotations ≥ {LARGE_ANGLE:g}°)"
    text = (
        f"For {where}: gap {zero:+.4f} at 0°, {large_gap(best):+.4f} averaged over "
        f"≥ {LARGE_ANGLE:g}°"
    )
    if best.growth is None:
        why = text + "; no per-point predictions, so no interval."
        number = f"mean gap ≥ {LARGE_ANGLE:g}° {large_gap(best):+.4f}, no CI"
        return Claim(BMA_PAPER, statement, None, why, number)
    g = best.growth
    verdicts = [growth_verdict(x) for x in gaps]
    counts = f"{verdicts.count(True)} of {len(gaps)} Bayesian predictors grow beyond noise"
    text += (
        f"; growth {signed(g.value)} [95% {signed(g.low)}, {signed(g.high)}] (paired bootstrap); "
        f"{counts}."
    )
    number = f"gap growth {interval_text(g.value, g.low, g.high)} ({best.predictor})"
    return Claim(BMA_PAPER, statement, growth_verdict(best), text, number)


def _shift_table(inputs: ReportInputs) -> Table | None:
    rows = []
    for p in inputs.predictors:
        s = corruption_summary(p)
        if s is None:
            continue
        m = s["means"]
        rows.append(
            [Cell(p.name), Cell(fmt_or_dash(100 * m["accuracy"], ".2f"))]
            + [Cell(fmt_or_dash(m[k])) for k in ("nll", "ece", "brier", "entropy")]
            + [Cell(f"{s['worst']} ({fmt_or_dash(s['worst_nll'])})")]
        )
    if not rows:
        return None
    header = ["Predictor", "Accuracy (%)", "NLL", "ECE", "Brier", "Entropy", "Worst (NLL)"]
    return Table(header, rows)


def _gap_table(gaps: list[ShiftGap]) -> Table:
    def interval(iv: Range | None) -> str:
        return interval_text(iv.value, iv.low, iv.high) if iv else "-"

    verdict = {True: "grows", False: "shrinks", None: "within noise / no interval"}
    rows = [
        [
            Cell(g.predictor),
            Cell(fmt_or_dash(g.gap[0], "+.4f") if g.angles[0] == 0 else "-"),
            Cell(fmt_or_dash(large_gap(g), "+.4f")),
            Cell(interval(g.growth)),
            Cell(verdict[growth_verdict(g)], bold=growth_verdict(g) is True),
        ]
        for g in gaps
    ]
    header = [
        "Predictor",
        "Gap at 0°",
        f"Mean gap ≥ {LARGE_ANGLE:g}°",
        "Growth [95%]",
        "Verdict",
    ]
    return Table(header, rows)


def _shift_sentence(inputs: ReportInputs, gaps: list[ShiftGap]) -> str:
    base = style.baseline(inputs)
    found = angles(base) if base is not None else []
    if not found:
        return "The baseline has no rotation metrics."
    first, last = found[0][1], found[-1][1]
    acc = [shift_value(base, n, "accuracy") for n in (first, last)]
    shift = inputs.params.get("evaluate", {}).get("shift", {})
    n = shift.get("n_points") if isinstance(shift, dict) else None
    where = f" on the {n} shifted test images (one seeded subset for every shift)" if n else ""
    text = (
        f"The baseline's accuracy{where} falls from {100 * acc[0]:.1f}% at {found[0][0]:g}° "
        f"to {100 * acc[1]:.1f}% at {found[-1][0]:g}°"
    )
    if gaps:
        best = max(gaps, key=lambda g: (large_gap(g), g.predictor))
        gap = large_gap(best)
        text += f"; the largest NLL gap at large rotations is {best.predictor}'s ({gap:+.4f})"
    return text + "."


def claims(inputs: ReportInputs) -> list[Claim]:
    """The section's claims without its figures (what the headline needs)."""
    return [_shift_claim(inputs, _shift_gaps(inputs))]


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    gaps = _shift_gaps(inputs)
    claim = _shift_claim(inputs, gaps)
    blocks: list[Block] = [Heading(2, "Dataset shift")]
    shift_png = style.png_or_none(shift_figure(inputs))
    if shift_png is None:
        return Section(
            [*blocks, Paragraph("No predictor has shift metrics; nothing to show.")], [claim]
        )
    blocks += [
        Paragraph(_shift_sentence(inputs, gaps)),
        *figure("analysis_shift", shift_png, CAPTIONS["analysis_shift"]),
    ]
    table = _shift_table(inputs)
    if table is not None:
        note = (
            "Mean over the corruptions (one fixed severity each) per predictor; the worst "
            "corruption by NLL in the last column."
        )
        blocks += [Paragraph(note), TableBlock(table)]
    gap_png = style.png_or_none(shift_gap_figure(inputs, gaps))
    blocks += figure("analysis_shift_gap", gap_png, CAPTIONS["analysis_shift_gap"])
    if gaps:
        blocks.append(TableBlock(_gap_table(gaps)))
    return Section([*blocks, claim_bullets([claim])], [claim])
