"""The report's first section: the best predictor per metric and how many beat the
baseline beyond noise, the ranking by test NLL with intervals, and which of the papers'
claims hold on this run (one table row each, the evidence collapsed beneath), so a reader
gets the answer before the details."""

from __future__ import annotations

import math

from ..blocks import (
    Block,
    Bullets,
    Cell,
    Details,
    Heading,
    Paragraph,
    Section,
    Table,
    TableBlock,
)
from ..claims import DSWAG_PAPER, Claim, claim_text
from ..formats import LABELS, interval_text, with_interval
from ..inputs import PredictorResult, ReportInputs
from ..intervals import LOWER_IS_BETTER, holm
from ..uncertainty import Uncertainty


def _nll(p: PredictorResult, unc: Uncertainty) -> float:
    found = unc.estimate(p.name, "nll")
    return found.value if found is not None else p.metric("nll")


def ranking(inputs: ReportInputs, unc: Uncertainty) -> list[PredictorResult]:
    """Predictors by test NLL, lowest first; missing NLL last, ties in table order."""
    return sorted(
        inputs.predictors,
        key=lambda p: (not math.isfinite(v := _nll(p, unc)), v if math.isfinite(v) else 0.0),
    )


def ranking_table(inputs: ReportInputs, unc: Uncertainty) -> Table:
    """Rank, NLL with its interval, and the paired difference to the baseline with verdict."""
    base = inputs.baseline
    header = ["Rank", "Predictor", "NLL [95% CI]", f"NLL - {base} [95% CI]", f"vs {base}"]
    rows = []
    for rank, p in enumerate(ranking(inputs, unc), start=1):
        value = with_interval("nll", _nll(p, unc), unc.estimate(p.name, "nll"))
        comp = unc.comparison(base, p.name)
        if p.name == base:
            diff, verdict = "", "baseline"
        elif comp is None:
            diff, verdict = "n/a", "no interval: no per-point predictions"
        else:
            iv = comp.intervals["nll"]
            diff = interval_text(iv.diff, iv.low, iv.high)
            verdict = {"better": "better", "worse": "worse"}.get(iv.verdict(), "within noise")
        rows.append(
            [
                Cell(str(rank)),
                Cell(p.name),
                Cell(value),
                Cell(diff),
                Cell(verdict, verdict == "better"),
            ]
        )
    return Table(header, rows)


def best_table(inputs: ReportInputs, unc: Uncertainty) -> Table:
    """Per metric: the best predictor with its interval, how many others are within noise
    of it (a paired interval holding 0), and how many predictors differ from the baseline
    beyond noise, better and worse, of those with per-point predictions: per comparison,
    and after Holm's correction for the number of comparisons."""
    base = inputs.baseline
    header = [
        "Metric",
        "Best predictor",
        "Its value [95% CI]",
        "Tied with the best",
        f"Better / worse than {base}",
        "The same, Holm-corrected",
    ]
    rows = []
    for key, label in LABELS.items():
        found = [p for p in inputs.predictors if math.isfinite(p.metric(key))]
        if not found:
            continue
        pick = min if LOWER_IS_BETTER[key] else max
        best = pick(found, key=lambda p: p.metric(key))
        value = with_interval(key, best.metric(key), unc.estimate(best.name, key))
        rows.append([Cell(label), Cell(best.name), Cell(value), Cell(_tied(best, found, key, unc))])
        rows[-1] += [Cell(text) for text in _against_baseline(base, found, key, unc)]
    return Table(header, rows)


def _tied(best: PredictorResult, found: list[PredictorResult], key: str, unc: Uncertainty) -> str:
    """'k of n': the others whose paired interval against the best holds 0."""
    paired = [i for p in found if p.name != best.name and (i := unc.paired(best.name, p.name, key))]
    if not paired:
        return "n/a: no per-point predictions"
    return f"{sum(i.verdict() == 'within noise' for i in paired)} of {len(paired)}"


def _against_baseline(
    base: str, found: list[PredictorResult], key: str, unc: Uncertainty
) -> tuple[str, str]:
    """'better / worse of n' against the baseline, per comparison and Holm-corrected."""
    comps = [
        c.intervals[key] for p in found if p.name != base and (c := unc.comparison(base, p.name))
    ]
    if not comps:
        return "n/a: no per-point predictions", "n/a"
    kept = holm([i.p_value for i in comps], 1 - unc.settings.level)
    verdicts = [i.verdict() for i in comps]
    held = [v for v, k in zip(verdicts, kept, strict=True) if k]
    each, corrected = (f"{v.count('better')} / {v.count('worse')}" for v in (verdicts, held))
    return f"{each} of {len(comps)}", f"{corrected} of {len(comps)}"


CLAIMS_NOTE = (
    "One row per claim: 'holds' or 'does not hold' where this run decides it, 'undecided' "
    "where the difference is within noise or data is missing; the last column gives the "
    "number that decides it, with its interval where there is one. The full evidence of "
    "each claim is in the collapsed list below the table."
)


def claims_table(found: list[Claim]) -> Table:
    """Paper, statement, verdict (bold where it holds) and the deciding number, one row per
    claim in the given order; every column is text."""
    header = ["Paper", "Claim", "Verdict", "Deciding number [95% CI]"]
    rows = [
        [Cell(c.paper), Cell(c.statement), Cell(c.verdict, c.holds is True), Cell(c.number)]
        for c in found
    ]
    return Table(header, rows, text_columns=len(header))


def claims_blocks(found: list[Claim]) -> list[Block]:
    """The claims table with the evidence of every claim collapsed beneath it."""
    if not found:
        return [Paragraph("No claim can be checked on these predictors.")]
    return [
        Paragraph(CLAIMS_NOTE),
        TableBlock(claims_table(found)),
        Details("Evidence for each claim", [Bullets([claim_text(c) for c in found])]),
    ]


def build(inputs: ReportInputs, unc: Uncertainty, found: list[Claim]) -> Section:
    """The headline, built last from every other section's claims and shown first.

    The claims keep the sections' order, the DSWAG paper's last: they are the
    most numerous.
    """
    s = unc.settings
    note = (
        f"Predictors ranked by test NLL (lower is better), each with its {100 * s.level:g}% "
        f"percentile bootstrap interval over the test points, and its paired difference to "
        f"the baseline {inputs.baseline} ({s.resamples} resamples, seed {s.seed}): 'better' "
        "or 'worse' only where that interval excludes 0."
    )
    ordered = sorted(found, key=lambda c: c.paper == DSWAG_PAPER)
    blocks = [
        Heading(2, "Headline"),
        Paragraph(
            "The best value of each test metric, how many other predictors are within noise "
            "of it, and how many predictors are better or worse than the baseline "
            f"{inputs.baseline} beyond noise (their paired {100 * s.level:g}% interval "
            "excludes 0); the rest are within noise. Each interval is one comparison's: of "
            "many comparisons at 95%, about one in twenty can exclude 0 by chance, so the "
            "last column keeps only those that survive Holm's correction for the number "
            f"of comparisons (family-wise error {100 * (1 - s.level):g}%, bootstrap p-values)."
        ),
        TableBlock(best_table(inputs, unc)),
        Paragraph(note),
        TableBlock(ranking_table(inputs, unc)),
        Heading(3, "The papers' claims on this run"),
        *claims_blocks(ordered),
    ]
    return Section(blocks)
