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
from ..intervals import LOWER_IS_BETTER
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
    """Per metric: the best predictor with its interval, and how many predictors differ
    from the baseline beyond noise (paired interval excluding 0), better and worse, of
    those with per-point predictions."""
    base = inputs.baseline
    header = ["Metric", "Best predictor", "Its value [95% CI]", f"Better / worse than {base}"]
    rows = []
    for key, label in LABELS.items():
        found = [p for p in inputs.predictors if math.isfinite(p.metric(key))]
        if not found:
            continue
        pick = min if LOWER_IS_BETTER[key] else max
        best = pick(found, key=lambda p: p.metric(key))
        value = with_interval(key, best.metric(key), unc.estimate(best.name, key))
        comps = [c for p in found if p.name != base and (c := unc.comparison(base, p.name))]
        verdicts = [c.intervals[key].verdict() for c in comps]
        counts = (
            f"{verdicts.count('better')} / {verdicts.count('worse')} of {len(comps)}"
            if comps
            else "n/a: no per-point predictions"
        )
        rows.append([Cell(label), Cell(best.name), Cell(value), Cell(counts)])
    return Table(header, rows)


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
            "The best value of each test metric, and how many predictors are better or worse "
            f"than the baseline {inputs.baseline} beyond noise (their paired "
            f"{100 * s.level:g}% interval excludes 0); the rest are within noise."
        ),
        TableBlock(best_table(inputs, unc)),
        Paragraph(note),
        TableBlock(ranking_table(inputs, unc)),
        Heading(3, "The papers' claims on this run"),
        *claims_blocks(ordered),
    ]
    return Section(blocks)
