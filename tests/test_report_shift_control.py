"""The shift claims against controls that average nothing: a Bayesian predictor's NLL gap
to the baseline counts only if it grows beyond the temperature-scaled baseline's, and
MultiSWAG's growth over the ensemble is split into MultiSWA's and the sampling's share."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import test_report_analyses as fixture

from bayesavg.report import Predictions, PredictorResult, ReportInputs
from bayesavg.report.claims import Claim
from bayesavg.report.sections import baselines, shift
from bayesavg.report.sections.shift import measures
from bayesavg.report.uncertainty import compute

STATEMENT = "helps most under shift"


def _planted(boosts: dict[str, float], control: float | None) -> ReportInputs:
    """The analyses fixture with each Bayesian predictor's confidence rising by its boost
    (logit per degree) and, unless ``control`` is None, map_ts rising by ``control``.
    Every predictor shares the baseline's draws, so equal boosts give equal predictions."""
    found = []
    for i, p in enumerate(fixture._predictors()):
        if p.name in boosts:
            pred = fixture._predictions(i, boosts[p.name])
            p = dataclasses.replace(p, predictions=pred, metrics=fixture._metrics(i, pred, 0.9))
        found.append(p)
    inputs = fixture._inputs(predictors=found)
    return inputs if control is None else fixture._with_control(inputs, control)


def _claim(inputs: ReportInputs) -> Claim:
    (claim,) = shift.claims(inputs)
    assert STATEMENT in claim.statement
    return claim


def _gaps(inputs: ReportInputs) -> tuple[list[measures.ShiftGap], measures.ShiftGap]:
    gaps = shift._shift_gaps(inputs)
    (control,) = [g for g in gaps if g.predictor == "map_ts"]
    return [g for g in gaps if g.bayesian], control


def test_a_control_with_the_same_growth_makes_the_claim_fail() -> None:
    """Every Bayesian predictor's gap to the baseline grows beyond noise (what the claim
    used to count), but map_ts, which averages nothing, grows just as much."""
    inputs = _planted(dict.fromkeys(("swag", "fswag", "ensemble"), 0.01), control=0.01)
    bayes, control = _gaps(inputs)
    assert control.growth is not None and control.growth.low > 0
    for g in bayes:
        assert measures.growth_verdict(g) is True
        assert g.beyond is not None and g.beyond.value == pytest.approx(0.0, abs=1e-12)
        assert measures.control_verdict(g, control) is None
    claim = _claim(inputs)
    assert claim.holds is False
    assert claim.number.startswith("0 beyond, 0 below of 3 vs map_ts's growth +")
    assert "3 of 3 Bayesian predictors' gaps to map grow beyond noise" in claim.evidence
    assert "0 of 3 Bayesian predictors grow beyond" in claim.evidence
    assert "3 do not (swag, fswag, ensemble); 0 grow less" in claim.evidence


@pytest.mark.parametrize(
    ("boosts", "counts", "holds"),
    [
        ({"swag": 0.02, "fswag": 0.02, "ensemble": 0.02}, (3, 0, 0), True),
        ({"swag": 0.02, "fswag": 0.02, "ensemble": 0.0}, (2, 0, 1), True),
        ({"swag": 0.02, "fswag": 0.01, "ensemble": 0.0}, (1, 1, 1), False),
        ({"swag": 0.02, "fswag": 0.01, "ensemble": 0.01}, (1, 2, 0), None),
        ({"swag": 0.0, "fswag": 0.0, "ensemble": 0.0}, (0, 0, 3), False),
    ],
)
def test_counts_follow_the_paired_verdicts_against_the_control(
    boosts: dict[str, float], counts: tuple[int, int, int], holds: bool | None
) -> None:
    inputs = _planted(boosts, control=0.01)
    bayes, control = _gaps(inputs)
    verdicts = [measures.control_verdict(g, control) for g in bayes]
    more, rest, less = counts
    assert (verdicts.count(True), verdicts.count(None), verdicts.count(False)) == counts
    for g, v in zip(bayes, verdicts, strict=True):
        assert g.growth is not None and g.beyond is not None and control.growth is not None
        # The gap to the control is the gap to the baseline less the control's, per point.
        assert g.beyond.value == pytest.approx(g.growth.value - control.growth.value)
        expected = {0.02: True, 0.01: None, 0.0: False}[boosts[g.predictor]]
        assert v is expected
    claim = _claim(inputs)
    assert claim.holds is holds
    assert claim.number.startswith(f"{more} beyond, {less} below of 3 vs map_ts's growth")
    assert f"{more} of 3 Bayesian predictors grow beyond" in claim.evidence
    assert f"; {rest} do not" in claim.evidence and f"; {less} grow less" in claim.evidence


def test_without_map_ts_the_claim_is_undecided_with_its_reason() -> None:
    inputs = _planted(dict.fromkeys(("swag", "fswag", "ensemble"), 0.02), control=None)
    gaps = shift._shift_gaps(inputs)
    assert all(measures.growth_verdict(g) is True for g in gaps if g.bayesian)
    assert all(g.beyond is None for g in gaps)
    claim = _claim(inputs)
    assert claim.holds is None
    assert claim.number == "n/a (no calibrated single-network control)"
    assert "No temperature-scaled map (map_ts)" in claim.evidence
    assert "cannot be decided" in claim.evidence


def test_the_control_is_a_temperature_scaled_single_network_of_the_baselines_method() -> None:
    inputs = _planted({}, control=0.0)
    base = inputs.predictors[0]
    assert measures.temperature_control(inputs, base).name == "map_ts"
    changed = []
    for p in inputs.predictors:
        if p.name == "map_ts":  # without a fitted temperature it is just another map
            p = dataclasses.replace(p, metrics={**p.metrics, "temperature": None})
        elif p.name == "swag":  # a temperature on an averaging predictor is no control
            p = dataclasses.replace(p, metrics={**p.metrics, "temperature": 1.2})
        changed.append(p)
    assert (
        measures.temperature_control(dataclasses.replace(inputs, predictors=changed), base) is None
    )
    other = dataclasses.replace(inputs.predictors[-1], name="map_t2")
    both = dataclasses.replace(
        inputs, predictors=[*inputs.predictors[:-1], other, inputs.predictors[-1]]
    )
    assert measures.temperature_control(both, base).name == "map_ts"


def test_the_gap_table_shows_the_single_networks_above_the_bayesian_ones() -> None:
    inputs = _planted(dict.fromkeys(("swag", "fswag", "ensemble"), 0.02), control=0.01)
    gaps = shift._shift_gaps(inputs)
    table = shift._gap_table(gaps, shift._control(inputs, gaps))
    assert "Growth beyond map_ts [95%]" in table.header
    rows = {r[0].text: [c.text for c in r] for r in table.rows}
    assert [r[0].text for r in table.rows] == ["map_ts", "swa", "swag", "fswag", "ensemble"]
    assert rows["map_ts"][1] == "no (control)" and rows["swa"][1] == "no"
    assert rows["swag"][1] == "yes" and rows["swag"][-1] == "beyond map_ts"
    # swa (no boost) grows less than map_ts: a single network is judged the same way.
    assert rows["swa"][-1] == "less than map_ts"
    assert all(len(r) == len(table.header) for r in table.rows)


# ------------------------------------------------------------------ MultiSWAG vs MultiSWA

N, C = 300, 10


def _multiswag_inputs(without: float, sampling: float, names: tuple[str, ...]) -> ReportInputs:
    """ensemble, multiswa and multiswag alike on clean images; under shot noise multiswa is
    ``without`` more confident on the label than the ensemble (logit) and multiswag a
    further ``sampling``; one shared noise draw, so only these gains differ."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, C, N)
    noise = rng.normal(0.0, 1.0, (N, C))

    def log_probs(confidence: float) -> np.ndarray:
        logits = noise.copy()
        logits[np.arange(N), y] += confidence
        return logits - np.log(np.exp(logits).sum(1, keepdims=True))

    gains = {"map": 0.0, "ensemble": 0.0, "multiswa": without, "multiswag": without + sampling}
    predictors = []
    for name in names:
        clean = log_probs(2.0)
        shifted = {"rotate_0": clean, "shot_noise": log_probs(gains[name])}
        nll = float(-clean[np.arange(N), y].mean())
        metrics = {"accuracy": float((clean.argmax(1) == y).mean()), "nll": nll, "n": float(N)}
        metrics |= {"ece": 0.01, "brier": 0.1}
        pred = Predictions(y, clean, y, shifted)
        predictors.append(PredictorResult(name, name, name, 0.0, metrics, [], [], pred))
    params = {"seed": 0, "report": {"bootstrap": {"resamples": 300, "seed": 0}}}
    return ReportInputs("multiswag", predictors, {}, params, [], "map")


ALL = ("map", "ensemble", "multiswa", "multiswag")
SAMPLING = "MultiSWAG's sampling adds to its NLL advantage under shift"
AGAINST_ENSEMBLE = "MultiSWAG's NLL advantage over the deep ensemble grows under shift"


def _baseline_claims(inputs: ReportInputs) -> dict[str, Claim]:
    """The baselines' claims by the start of their statement (as SAMPLING and
    AGAINST_ENSEMBLE give it)."""
    found = baselines.claims(inputs, compute(inputs))
    return {k: c for c in found for k in (SAMPLING, AGAINST_ENSEMBLE) if c.statement.startswith(k)}


@pytest.mark.parametrize(("sampling", "holds"), [(1.0, True), (0.0, None), (-0.5, False)])
def test_the_sampling_claim_is_multiswag_against_multiswa(
    sampling: float, holds: bool | None
) -> None:
    inputs = _multiswag_inputs(1.5, sampling, ALL)
    found = _baseline_claims(inputs)
    claim = found[SAMPLING]
    assert claim.holds is holds, claim.evidence
    by_name = {p.name: p for p in inputs.predictors}
    boot = (300, 0)
    share = baselines.shift_growth(by_name["multiswa"], by_name["multiswag"], boot)
    total = baselines.shift_growth(by_name["ensemble"], by_name["multiswag"], boot)
    without = baselines.shift_growth(by_name["ensemble"], by_name["multiswa"], boot)
    assert share is not None and total is not None and without is not None
    assert total[0] == pytest.approx(without[0] + share[0])
    assert claim.number == f"gap growth {share[0]:+.4f} [{share[1]:+.4f}, {share[2]:+.4f}]"
    # MultiSWA alone already grows against the ensemble: the paper's comparison holds
    # whatever the sampling adds, and its evidence says how much comes without it.
    assert without[1] > 0
    ensemble_claim = found[AGAINST_ENSEMBLE]
    assert f"Of it, {without[0]:+.4f} [{without[1]:+.4f}, {without[2]:+.4f}]" in (
        ensemble_claim.evidence
    )
    assert "comes without sampling" in ensemble_claim.evidence


def test_without_multiswa_the_share_is_unknown_and_no_sampling_claim() -> None:
    inputs = _multiswag_inputs(1.5, 1.0, ("map", "ensemble", "multiswag"))
    found = _baseline_claims(inputs)
    assert SAMPLING not in found
    assert found[AGAINST_ENSEMBLE].holds is True
    assert "how much of it comes without sampling is unknown" in found[AGAINST_ENSEMBLE].evidence


@pytest.mark.parametrize("dip", [True, False])
def test_the_shift_sentence_names_a_dip_between_the_ends(dip: bool) -> None:
    """A digit rotated 180° can read right again: the accuracy's low between 0° and the
    largest angle is said when it is below both ends, and only then."""
    inputs = fixture._inputs()
    base = inputs.predictors[0]
    rotations = measures.angles(base)
    accuracy = {
        name: 0.97 - 0.6 * i / (len(rotations) - 1) for i, (_, name) in enumerate(rotations)
    }
    middle_angle, middle = rotations[len(rotations) // 2]
    if dip:
        accuracy[middle] = 0.08
    shifted = {
        n: {**m, "accuracy": accuracy.get(n, m["accuracy"])}
        for n, m in base.metrics["shift"].items()
    }
    inputs = dataclasses.replace(
        inputs,
        predictors=[
            dataclasses.replace(base, metrics={**base.metrics, "shift": shifted}),
            *inputs.predictors[1:],
        ],
    )
    text = shift._shift_sentence(inputs, shift._shift_gaps(inputs))
    assert f"falls from 97.0% at {rotations[0][0]:g}° to 37.0% at {rotations[-1][0]:g}°" in text
    assert (f", through 8.0% at {middle_angle:g}°" in text) is dip
    assert ("through" in text) is dip


def test_single_networks_alone_draw_no_gap_figure_and_build() -> None:
    """A run whose only predictor besides the baseline is its temperature-scaled twin
    (the control): its gap is measured, but no family panel holds it, so there is no
    figure, and the section still builds (it divided by zero)."""
    from bayesavg.report.sections.shift import figures

    inputs = fixture._with_control(fixture._inputs(), 0.01)
    singles = [p for p in inputs.predictors if p.name in ("map", "map_ts")]
    inputs = dataclasses.replace(inputs, predictors=singles)
    gaps = shift._shift_gaps(inputs)
    assert gaps and not any(g.bayesian for g in gaps)
    assert figures.shift_gap_figure(inputs, gaps) is None
    assert shift.build(inputs, compute(inputs)).blocks
