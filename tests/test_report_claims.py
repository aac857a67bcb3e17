"""The headline's claims table: one row per claim a section checks, each with its deciding
number, and every claim's evidence collapsed beneath it in both report files.

The analysis sections are not pinned out here (no ``no_analyses``): every claim family
comes in, from the fixtures of the other report tests.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import NamedTuple

import pytest
import test_report
import test_report_analyses
import test_report_dswag

from bayesavg.report import ReportInputs, document, write_report
from bayesavg.report.blocks import Bullets, Details, Heading, Section, TableBlock
from bayesavg.report.claims import DSWAG_PAPER, Claim, claim_text
from bayesavg.report.formats import LABELS, interval_number, interval_text, signed, unsigned
from bayesavg.report.intervals import Interval
from bayesavg.report.render import to_html, to_markdown
from bayesavg.report.sections import (
    comparisons,
    distributed,
    headline,
    landscape,
    ood,
    sharpness,
    shift,
)
from bayesavg.report.sections.shift import measures as shift_measures
from bayesavg.report.uncertainty import compute

HEADER = ["Paper", "Claim", "Verdict", "Deciding number [95% CI]"]


def _dswag_without_sweep() -> ReportInputs:
    return dataclasses.replace(test_report_dswag._dswag_inputs(), dswag_sweep=[])


def _dswag_without_roles() -> ReportInputs:
    return dataclasses.replace(test_report_dswag._dswag_inputs(), params={})


def _analyses_bare() -> ReportInputs:
    return test_report_analyses._inputs(landscape=None, dswag_sweep=[])


# Every fixture the report tests build, by name: the claims decided and undecided.
FIXTURES: dict[str, Callable[[], ReportInputs]] = {
    "bare": test_report._inputs,
    "pairs": test_report._pair_inputs,
    "families": test_report._family_inputs,
    "full": test_report._full_inputs,
    "analyses": test_report_analyses._inputs,
    "analyses_bare": _analyses_bare,
    "dswag": test_report_dswag._dswag_inputs,
    "dswag_without_sweep": _dswag_without_sweep,
    "dswag_without_roles": _dswag_without_roles,
}


def _claims(inputs: ReportInputs) -> list[Claim]:
    """Every claim the sections check, from their ``claims`` (no figures drawn)."""
    unc = compute(inputs)
    found = comparisons.claims(inputs, unc) + distributed.claims(inputs, unc)
    for section in (shift, ood, landscape, sharpness):
        found += section.claims(inputs)
    return found


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_claim_has_a_deciding_number(name: str) -> None:
    """Non-empty and finite; 'n/a' only where the claim is left undecided."""
    found = _claims(FIXTURES[name]())
    assert found
    for claim in found:
        assert claim.number.strip(), claim
        assert not re.search(r"\b(nan|inf)\b", claim.number, re.I), claim
        if claim.holds is not None:
            assert not claim.number.startswith("n/a"), claim


class Report(NamedTuple):
    """What the sections returned, what the headline built from them, and the files."""

    claims: list[Claim]
    headline: Section
    paths: dict[str, Path]


@pytest.fixture(scope="module", params=["analyses", "dswag", "families"])
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Report:
    """The whole report, with every section's returned claims and the headline recorded."""
    sections: list[Section] = []
    built: list[Section] = []

    def recording(build: Callable[..., Section], into: list[Section]) -> Callable[..., Section]:
        def wrapped(*args: object) -> Section:
            into.append(build(*args))
            return into[-1]

        return wrapped

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(document, "BODY", tuple(recording(b, sections) for b in document.BODY))
        mp.setattr(headline, "build", recording(headline.build, built))
        paths = write_report(FIXTURES[request.param](), tmp_path_factory.mktemp(request.param))
    claims = [c for s in sections for c in s.claims]
    assert claims and len(built) == 1
    return Report(claims, built[0], paths)


def _claims_table(section: Section) -> TableBlock:
    (table,) = [b for b in section.blocks if isinstance(b, TableBlock) and b.table.header == HEADER]
    return table


def test_every_claim_is_one_row_of_the_headline_table(report: Report) -> None:
    rows = [[c.text for c in row] for row in _claims_table(report.headline).table.rows]
    assert len(rows) == len(report.claims)
    for claim in report.claims:
        expected = [claim.paper, claim.statement, claim.verdict, claim.number]
        assert rows.count(expected) == 1, expected
    # The DSWAG paper's claims come last, the others in the sections' order.
    papers = [row[0] for row in rows]
    others = [c for c in report.claims if c.paper != DSWAG_PAPER]
    assert [r[1] for r in rows[: len(others)]] == [c.statement for c in others]
    assert all(p == DSWAG_PAPER for p in papers[len(others) :])


def test_verdicts_that_hold_are_bold(report: Report) -> None:
    table = _claims_table(report.headline).table
    assert [row[2].bold for row in table.rows] == [row[2].text == "holds" for row in table.rows]


class _Details(HTMLParser):
    """The summary and the list items of each ``<details>`` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, list[str]]] = []
        self._depth = 0
        self._text: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "details":
            self._depth += 1
            self.found.append(("", []))
        elif self._depth and tag in ("summary", "li"):
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "details":
            self._depth -= 1
        elif self._text is not None and tag in ("summary", "li"):
            summary, items = self.found[-1]
            text = "".join(self._text)
            self.found[-1] = (text, items) if tag == "summary" else (summary, [*items, text])
            self._text = None


def test_html_collapses_every_claims_evidence_under_the_table(report: Report) -> None:
    page = report.paths["html"].read_text(encoding="utf-8")
    top = page.split("<h2>Headline</h2>")[1].split("<h2>")[0]
    assert top.index("<th>Paper</th>") < top.index("<details>")
    parser = _Details()
    parser.feed(top)
    ((summary, items),) = parser.found
    assert summary == "Evidence for each claim"
    assert len(items) == len(report.claims)
    for claim in report.claims:
        assert claim_text(claim) in items
        assert claim.evidence in items[items.index(claim_text(claim))]


def test_markdown_collapses_the_same_evidence(report: Report) -> None:
    md = report.paths["md"].read_text(encoding="utf-8")
    top = md.split("## Headline")[1].split("\n## ")[0]
    table, rest = top.split("\n<details>\n<summary>Evidence for each claim</summary>\n\n")
    evidence = rest.split("\n\n</details>")[0]
    assert evidence.splitlines() == [
        f"- {claim_text(c)}" for c in sorted(report.claims, key=lambda c: c.paper == DSWAG_PAPER)
    ]
    assert "| Paper | Claim | Verdict | Deciding number [95% CI] |" in table


def test_details_render_their_blocks_in_both_files() -> None:
    blocks = [
        Heading(1, "t"),
        Details("Why <so>", [Bullets(["a | b", "c & d"])]),
    ]
    page = to_html(blocks)
    assert "<details>\n<summary>Why &lt;so&gt;</summary>\n<ul>\n<li>a | b</li>" in page
    assert "<li>c &amp; d</li>\n</ul>\n</details>" in page
    md = to_markdown(blocks)
    assert "<details>\n<summary>Why &lt;so&gt;</summary>\n\n- a | b\n- c & d\n\n</details>" in md


def test_no_claims_leave_a_sentence_and_no_table() -> None:
    blocks = headline.claims_blocks([])
    assert [b.kind for b in blocks] == ["paragraph"]


# ------------------------------------------------ each family's number, from its own numbers


def _deciding(comp_intervals: dict[str, Interval], keys: tuple[str, ...]) -> Interval:
    """The claimed metric that decides a pair claim, found one verdict at a time."""
    verdicts = [comp_intervals[k].verdict() for k in keys]
    for wanted in ("worse", "within noise"):
        if wanted in verdicts:
            return comp_intervals[keys[verdicts.index(wanted)]]
    return comp_intervals[keys[0]]


@pytest.fixture(scope="module")
def predicted() -> ReportInputs:
    return test_report._with_predictions(test_report._inputs())


def test_a_pair_claims_number_is_its_deciding_interval(predicted: ReportInputs) -> None:
    """An F-variant with per-point predictions: the first metric that is worse, else within
    noise, else the first claimed, with its paired interval and the count of improvements."""
    named = [
        dataclasses.replace(p, name="fswa") if p.name == "swag" else p for p in predicted.predictors
    ]
    inputs = dataclasses.replace(predicted, predictors=named, pairs=[("swa", "fswa")])
    unc = compute(inputs)
    (claim,) = comparisons.claims(inputs, unc)
    comp = unc.comparison("swa", "fswa")
    assert comp is not None
    keys = ("accuracy", "nll", "ece", "brier")
    better = [LABELS[k] for k in keys if comp.intervals[k].verdict() == "better"]
    which = f": {', '.join(better)}" if 0 < len(better) < 4 else ""
    deciding = interval_number(_deciding(comp.intervals, keys))
    assert claim.number == f"{deciding} ({len(better)} of 4 better{which})"
    assert re.fullmatch(
        r"\w+ diff [+-][\d.]+( pp)? \[[+-][\d.]+, [+-][\d.]+\] \(\d of 4 better(: .+)?\)",
        claim.number,
    )


def test_dswag_numbers_are_the_evidences_differences() -> None:
    found = {c.statement[:4]: c for c in distributed.claims(test_report_dswag._dswag_inputs())}
    b, c = found["(b) "], found["(c) "]
    # (b): NLL without an interval (no predictions), accuracy with the unpaired binomial one.
    assert b.number == "NLL diff +0.0200, no CI; accuracy diff -0.50 pp [-2.45, +1.45]"
    assert "+0.0200, no interval" in b.evidence and "-0.50 pp, unpaired binomial" in b.evidence
    assert "-2.45 to +1.45 pp" in b.evidence
    assert c.number == "ECE diff -0.0200, no CI" and "ECE 0.0100 vs 0.0300" in c.evidence
    assert found["(a) "].number == "rounds to target: W=1 > 6, W=4 3, W=8 2"


def test_shift_number_counts_the_growths_beyond_the_controls() -> None:
    inputs = test_report_analyses._with_control(test_report_analyses._inputs(), 0.0)
    (claim,) = shift.claims(inputs)
    gaps = shift._shift_gaps(inputs)
    (control,) = [g for g in gaps if g.predictor == "map_ts"]
    bayes = [g for g in gaps if g.bayesian]
    verdicts = [shift_measures.control_verdict(g, control) for g in bayes]
    g = control.growth
    assert g is not None and claim.holds is True and verdicts == [True] * len(bayes)
    growth = interval_text(g.value, g.low, g.high)
    n = len(bayes)
    assert claim.number == f"{n} beyond, 0 below of {n} vs map_ts's growth {growth}"
    assert f"map_ts by {growth}" in claim.evidence


def test_sharpness_number_is_the_weakest_correlation_when_it_holds() -> None:
    inputs = test_report_analyses._inputs()
    for claim in sharpness.claims(inputs):
        assert claim.holds is True
        label = claim.statement.split("lower ")[1].split(" goes")[0]
        x = "sharpness" if label == "SAM sharpness" else "hessian_trace"
        weakest = min(sharpness.sharpness_correlations(inputs, x), key=lambda c: c.rho)
        assert claim.number.startswith(f"rho({label}, {weakest.y.upper()}) {weakest.rho:+.2f}, p ")
        assert f"{weakest.rho:+.2f}" in claim.evidence


def test_ood_number_counts_the_predictors_beyond_noise() -> None:
    (claim,) = ood.claims(test_report_analyses._inputs())
    assert claim.holds is True and claim.number.startswith("3 higher, 0 lower of 3 vs AUROC ")
    assert "3 are higher" in claim.evidence and "0.8000" in claim.number + claim.evidence
    assert math.isfinite(float(claim.number.rsplit(" ", 1)[1]))


def test_a_bound_that_decides_a_verdict_never_reads_as_zero() -> None:
    """A bound of 4e-5 is written +0.000040, not +0.0000 beside the word 'worse'; a value
    that four decimals show is written at four; zero stays zero."""
    assert signed(0.0123) == "+0.0123" and signed(-0.0123) == "-0.0123"
    assert signed(4.04e-5) == "+0.000040" and signed(-3.1e-7) == "-0.00000031"
    assert signed(0.0) == "+0.0000" and unsigned(4.04e-5) == "0.000040"
    assert signed(float("nan")) == "+nan"
    worse = Interval("aurc", 0.0027, 4.04e-5, 0.0076, 0.95, 1000)
    assert worse.verdict() == "worse"
    assert interval_number(worse) == "aurc diff +0.0027 [+0.000040, +0.0076]"
    better = Interval("nll", -0.01, -0.02, -2e-6, 0.95, 1000)
    assert comparisons.effect(better) == "improves NLL by 0.0100 (95% CI 0.0000020-0.0200)"
    for low in (1e-9, 3e-6, 4.9e-5, 5e-5, 0.01):
        text = interval_text(0.02, low, 0.03)
        assert float(text.split("[")[1].split(",")[0]) > 0, text
