"""Dataset shift: test metrics on rotated and corrupted test images, and whether the
Bayesian predictors' NLL gap to the baseline grows with the rotation more than the gap of
the temperature-scaled baseline, which averages nothing."""

from __future__ import annotations

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
    control_verdict,
    corruption_summary,
    growth_verdict,
    large_gap,
    shift_gaps,
    shift_value,
    temperature_control,
)

CAPTIONS = {
    "analysis_shift": (
        "Test metrics on the rotated test subset against the rotation angle (0° is "
        "the clean subset), a row per family with the baseline (dotted grey) in each; F-variants "
        "dashed. Each metric has its own axis."
    ),
    "analysis_shift_gap": (
        "NLL of the baseline minus NLL of each predictor per rotation angle (above 0: the "
        "predictor is better), with 95% paired-bootstrap intervals over the shifted test "
        "points where per-point predictions exist. Single networks are drawn too, and the "
        "temperature-scaled baseline (grey, dashed) in every panel: a predictor that is only "
        "less over-confident than the baseline, averaging nothing, also shows a growing gap."
    ),
}


@per_inputs
def _shift_gaps(inputs: ReportInputs) -> list[ShiftGap]:
    """Paired bootstraps per predictor and angle: drawn, claimed and tabled, so computed
    once per inputs."""
    base = style.baseline(inputs)
    return shift_gaps(inputs, base) if base is not None and angles(base) else []


def _control(inputs: ReportInputs, gaps: list[ShiftGap]) -> ShiftGap | None:
    """The temperature-scaled baseline's gap (the claim's control), if the run has one."""
    base = style.baseline(inputs)
    found = temperature_control(inputs, base) if base is not None else None
    return next((g for g in gaps if found is not None and g.predictor == found.name), None)


def _rise(inputs: ReportInputs) -> str:
    """How far the baseline's own NLL rises: why a less over-confident predictor's gap to
    it grows whether or not it averages."""
    base = style.baseline(inputs)
    found = angles(base) if base is not None else []
    if base is None or not found:
        return ""
    (a0, n0), (a1, n1) = found[0], found[-1]
    nll0, nll1 = shift_value(base, n0, "nll"), shift_value(base, n1, "nll")
    return f"{base.name}'s NLL rises from {nll0:.2f} at {a0:g}° to {nll1:.2f} at {a1:g}°"


def _names(gaps: list[ShiftGap]) -> str:
    return f" ({', '.join(g.predictor for g in gaps)})" if gaps else ""


def _shift_claim(inputs: ReportInputs, gaps: list[ShiftGap]) -> Claim:
    """Decided against the temperature-scaled baseline, not the baseline: a predictor that
    is only less over-confident than the baseline also shows a growing gap."""
    statement = (
        "Bayesian averaging helps most under shift: its NLL gap to the baseline grows with "
        "the rotation beyond a temperature-scaled single network's"
    )
    bayes = [g for g in gaps if g.bayesian]
    if not bayes:
        return Claim(
            BMA_PAPER,
            statement,
            None,
            "No rotation metrics for the baseline and a Bayesian predictor.",
            "n/a (no rotation metrics)",
        )
    base, control = inputs.baseline, _control(inputs, gaps)
    plain = [growth_verdict(g) for g in bayes]
    against_base = (
        f"{plain.count(True)} of {len(bayes)} Bayesian predictors' gaps to {base} grow beyond noise"
    )
    if control is None:
        why = (
            f"No temperature-scaled {base} ({base}_ts) with rotation metrics in this run: "
            "without a calibrated single-network control the claim cannot be decided, since "
            f"{_rise(inputs)} and any less over-confident predictor, averaging or not, shows "
            f"a growing gap to it; {against_base}, which alone is no evidence of averaging."
        )
        return Claim(BMA_PAPER, statement, None, why, "n/a (no calibrated single-network control)")
    decided = [g for g in bayes if g.beyond is not None]
    if control.growth is None or not decided:
        best = max(bayes, key=lambda g: (large_gap(g), g.predictor))
        why = (
            f"Mean NLL gap to {base} at rotations ≥ {LARGE_ANGLE:g}°: {best.predictor} (the "
            f"largest) {fmt_or_dash(large_gap(best), '+.4f')}, the temperature-scaled "
            f"{control.predictor} {fmt_or_dash(large_gap(control), '+.4f')}; no per-point "
            "predictions, so no interval."
        )
        number = (
            f"mean gap ≥ {LARGE_ANGLE:g}° {fmt_or_dash(large_gap(best), '+.4f')} "
            f"({best.predictor}) vs {fmt_or_dash(large_gap(control), '+.4f')} "
            f"({control.predictor}), no CI"
        )
        return Claim(BMA_PAPER, statement, None, why, number)
    verdicts = [control_verdict(g, control) for g in decided]
    more = [g for g, v in zip(decided, verdicts, strict=True) if v is True]
    less = [g for g, v in zip(decided, verdicts, strict=True) if v is False]
    rest = [g for g, v in zip(decided, verdicts, strict=True) if v is None]
    n = len(decided)
    holds = True if len(more) > n / 2 else (False if len(more) <= len(less) else None)
    g = control.growth
    ctrl = f"{control.predictor}'s growth {interval_text(g.value, g.low, g.high)}"
    singles = [x for x in gaps if not x.bayesian and x.growth is not None]
    single_text = ", ".join(f"{x.predictor} {signed(x.growth.value)}" for x in singles)
    top = max(decided, key=lambda x: (x.beyond.value, x.predictor))
    text = (
        f"{_rise(inputs)}; {against_base}, but the single networks, which average no predictions, "
        f"grow too ({single_text}), the temperature-scaled {control.predictor} by "
        f"{interval_text(g.value, g.low, g.high)} (mean gap ≥ {LARGE_ANGLE:g}° minus the gap "
        f"at 0°, paired bootstrap over the shifted images). Measured against "
        f"{control.predictor} (the growth of each predictor's NLL gap to it, paired): "
        f"{len(more)} of {n} Bayesian predictors grow beyond the temperature-scaled "
        f"baseline's growth{_names(more)}; {len(rest)} do not{_names(rest)}; {len(less)} "
        f"grow less{_names(less)}. "
        f"Largest: {top.predictor} "
        f"{interval_text(top.beyond.value, top.beyond.low, top.beyond.high)}."
    )
    number = f"{len(more)} beyond, {len(less)} below of {n} vs {ctrl}"
    return Claim(BMA_PAPER, statement, holds, text, number)


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


def _interval(iv: Range | None) -> str:
    return interval_text(iv.value, iv.low, iv.high) if iv else "-"


def _verdict_cells(g: ShiftGap, control: ShiftGap | None) -> list[Cell]:
    """The growth beyond the control and the verdict against it; against the baseline
    when the run has no control (and then no growth-beyond column)."""
    if control is None:
        verdict = growth_verdict(g)
        text = {True: "grows", False: "shrinks", None: "within noise / no interval"}[verdict]
        return [Cell(text, bold=verdict is True and g.bayesian)]
    if g is control:
        return [Cell("-"), Cell("the control")]
    name = control.predictor
    verdict = control_verdict(g, control)
    text = {True: f"beyond {name}", False: f"less than {name}", None: f"not beyond {name}"}
    return [Cell(_interval(g.beyond)), Cell(text[verdict], bold=verdict is True and g.bayesian)]


def _gap_table(gaps: list[ShiftGap], control: ShiftGap | None = None) -> Table:
    """The single networks (the control first) above the Bayesian predictors, so a reader
    sees how much a predictor that averages nothing grows."""
    singles = sorted((g for g in gaps if not g.bayesian), key=lambda g: g is not control)
    rows = [
        [
            Cell(g.predictor),
            Cell("yes" if g.bayesian else "no (control)" if g is control else "no"),
            Cell(fmt_or_dash(g.gap[0], "+.4f") if g.angles[0] == 0 else "-"),
            Cell(fmt_or_dash(large_gap(g), "+.4f")),
            Cell(_interval(g.growth)),
            *_verdict_cells(g, control),
        ]
        for g in [*singles, *(g for g in gaps if g.bayesian)]
    ]
    header = ["Predictor", "Bayesian", "Gap at 0°", f"Mean gap ≥ {LARGE_ANGLE:g}°", "Growth [95%]"]
    if control is not None:
        header.append(f"Growth beyond {control.predictor} [95%]")
    return Table([*header, "Verdict"], rows, text_columns=2)


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
    inner = [(shift_value(base, name, "accuracy"), angle) for angle, name in found[1:-1]]
    low = min(inner, default=None)
    if low is not None and low[0] < min(acc):  # not monotone: a 6 upside down reads 9
        text += f", through {100 * low[0]:.1f}% at {low[1]:g}°"
    bayes = [g for g in gaps if g.bayesian]
    if bayes:
        best = max(bayes, key=lambda g: (large_gap(g), g.predictor))
        gap = large_gap(best)
        text += f"; the largest NLL gap at large rotations is {best.predictor}'s ({gap:+.4f})"
    control = _control(inputs, gaps)
    if control is not None:
        text += (
            f", the temperature-scaled {control.predictor}'s, which averages nothing, "
            f"{large_gap(control):+.4f}"
        )
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
        blocks.append(TableBlock(_gap_table(gaps, _control(inputs, gaps))))
    return Section([*blocks, claim_bullets([claim])], [claim])
