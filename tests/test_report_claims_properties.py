"""What the report says, decided from planted intervals: a verdict follows the interval
(ALGORITHMS §10: 'improves' only where it excludes 0), a worse difference makes a claim
fail, the headline's Holm-corrected counts, the NLL ranking, and the baselines' claims.

Most tests plant the intervals in a stand-in for ``Uncertainty``, so each verdict rests on
numbers chosen to sit on one side of a rule and not on what a bootstrap happens to draw.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import pytest
import test_config
import test_report
import test_report_seeds
import torch
import yaml

from bayesavg.config import parse_params
from bayesavg.report import PredictorResult, ReportInputs
from bayesavg.report.claims import FLAT_PAPER, HWA_PAPER, Claim, finding_text
from bayesavg.report.intervals import Interval, resample_counts
from bayesavg.report.sections import baselines, comparisons, headline, seeds
from bayesavg.report.stats import spearman
from bayesavg.report.uncertainty import Comparison, Settings, compute
from bayesavg.runtime.errors import UserError

KEYS = ("accuracy", "nll", "ece", "brier")


def _iv(metric: str, verdict: str, p_value: float = 0.01) -> Interval:
    """A planted interval of candidate - reference with the given verdict."""
    lower = metric != "accuracy"
    if verdict == "within noise":
        return Interval(metric, 0.001, -0.002, 0.004, 0.95, 1000, 0.5)
    gain = verdict == "better"
    sign = -1.0 if lower == gain else 1.0
    return Interval(metric, sign * 0.02, sign * 0.01, sign * 0.03, 0.95, 1000, p_value)


@dataclass
class _Planted:
    """An ``Uncertainty`` stand-in: planted comparisons by (reference, candidate), no
    estimates and no extra paired intervals."""

    comparisons: dict[tuple[str, str], dict[str, Interval]]
    settings: Settings = field(default_factory=lambda: Settings(1000, 0, 0.95))

    def estimate(self, name: str, metric: str) -> None:
        return None

    def paired(self, reference: str, candidate: str, metric: str) -> None:
        return None

    def comparison(self, reference: str, candidate: str) -> Comparison | None:
        found = self.comparisons.get((reference, candidate))
        return None if found is None else Comparison(reference, candidate, found, 1.0)


def _renamed(inputs: ReportInputs, names: dict[str, str], **methods: str) -> ReportInputs:
    """The predictors renamed (and given a method) by name."""
    predictors = [
        dataclasses.replace(p, name=names.get(p.name, p.name), method=methods.get(p.name, p.method))
        for p in inputs.predictors
    ]
    return dataclasses.replace(inputs, predictors=predictors)


# ------------------------------------------------------------------------ claims, stats


def test_an_analysis_finding_states_its_own_verdict() -> None:
    """The section form names the verdict the claim carries, whichever it is."""
    for holds, verdict in ((True, "holds"), (False, "does not hold"), (None, "undecided")):
        text = finding_text(Claim("P", "s", holds, "e.", "n"))
        assert text == f"s (P): {verdict}. e."


def test_spearman_of_a_constant_is_nan_not_zero() -> None:
    """No ranking to correlate is no number, not a correlation of 0."""
    assert math.isnan(spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert spearman([1.0, 2.0, 3.0], [3.0, 1.0, 2.0]) == pytest.approx(-0.5)


# ------------------------------------------------------------------ comparisons' claims


@pytest.fixture(scope="module")
def flat_pair() -> ReportInputs:
    """swa and its F-variant fswa (no predictions: every interval is planted)."""
    inputs = _renamed(test_report._inputs(), {"swag": "fswa"})
    return dataclasses.replace(inputs, pairs=[("swa", "fswa")])


@pytest.mark.parametrize(
    ("verdicts", "holds"),
    [
        (("better", "better", "better", "better"), True),
        (("better", "worse", "better", "better"), False),
        (("better", "better", "within noise", "better"), None),
        (("within noise", "worse", "within noise", "within noise"), False),
    ],
)
def test_a_pair_claim_holds_on_every_metric_and_fails_on_one_worse(
    flat_pair: ReportInputs, verdicts: tuple[str, ...], holds: bool | None
) -> None:
    """Holds only when all four metrics improve; one worse makes it fail; else undecided."""
    planted = {k: _iv(k, v) for k, v in zip(KEYS, verdicts, strict=True)}
    (claim,) = comparisons.claims(flat_pair, _Planted({("swa", "fswa"): planted}))
    assert (claim.paper, claim.holds) == (FLAT_PAPER, holds)
    assert claim.statement == "fswa improves on swa in accuracy, NLL, ECE and Brier"
    if holds:
        assert claim.number.endswith("(4 of 4 better)"), claim.number


def test_an_unpaired_pair_claim_is_undecided_on_candidate_minus_reference(
    flat_pair: ReportInputs,
) -> None:
    """No per-point predictions: no verdict, the raw accuracy difference fswa - swa."""
    (claim,) = comparisons.claims(flat_pair, _Planted({}))
    assert claim.holds is None and claim.number.startswith("accuracy diff -1.00 pp")


def test_hwa_is_claimed_on_accuracy_nll_and_ece_only() -> None:
    """HWA's claim ignores Brier: a worse Brier leaves it holding."""
    inputs = _renamed(test_report._inputs(), {"map": "vi", "swag": "hwa"}, map="vi", swag="hwa")
    inputs = dataclasses.replace(inputs, pairs=[("vi", "hwa")])
    planted = {k: _iv(k, "worse" if k == "brier" else "better") for k in KEYS}
    (claim,) = comparisons.claims(inputs, _Planted({("vi", "hwa"): planted}))
    assert (claim.paper, claim.holds) == (HWA_PAPER, True)
    assert "Brier" not in claim.statement and "3 of 3 better" in claim.number


def test_an_effect_reads_its_difference_with_its_sign() -> None:
    """Within noise: the signed difference as measured, candidate - reference."""
    noise = Interval("nll", -0.003, -0.009, 0.015, 0.95, 1000)
    assert comparisons.effect(noise) == "NLL within noise (-0.0030, 95% CI -0.0090 to +0.0150)"
    zero = Interval("nll", 0.0, -0.01, 0.01, 0.95, 1000)
    assert comparisons.effect(zero) == "NLL within noise (+0.0000, 95% CI -0.0100 to +0.0100)"
    assert "improves" in comparisons.effect(_iv("accuracy", "better"))
    assert "worsens" in comparisons.effect(_iv("nll", "worse"))


def test_a_line_without_predictions_gives_candidate_minus_reference() -> None:
    """No interval: the raw differences, candidate - reference (swag's NLL is lower)."""
    inputs = test_report._inputs()
    by_name = {p.name: p for p in inputs.predictors}
    line = comparisons.comparison_line(by_name["map"], by_name["swag"], None)
    assert "NLL -0.0266" in line and "accuracy -0.50 pp" in line


def test_effects_list_improvements_then_losses_then_noise() -> None:
    planted = {"accuracy": _iv("accuracy", "within noise"), "nll": _iv("nll", "worse")}
    planted |= {"ece": _iv("ece", "better"), "brier": _iv("brier", "within noise")}
    texts = comparisons._effects(Comparison("a", "b", planted, 0.5), KEYS)
    assert [t.split()[0] for t in texts] == ["improves", "worsens", "accuracy", "Brier"]


# ------------------------------------------------------------------------------ headline


def test_the_holm_column_counts_only_what_survives_the_correction() -> None:
    """Four better than the baseline at p 0.001, 0.02, 0.03, 0.04 and one worse at 0.004:
    all five exclude 0 one by one; Holm at 5% keeps p <= 0.01 then p <= 0.0125, and stops
    at 0.02 > 0.0167."""
    inputs = test_report._inputs()
    names = ["a", "b", "c", "d", "e"]
    extra = [dataclasses.replace(inputs.predictors[1], name=n) for n in names]
    inputs = dataclasses.replace(inputs, predictors=[inputs.predictors[0], *extra])
    ps = {"a": 0.001, "b": 0.02, "c": 0.03, "d": 0.04, "e": 0.004}
    planted = {
        ("map", n): {"nll": _iv("nll", "worse" if n == "e" else "better", p)} for n, p in ps.items()
    }
    each, corrected = headline._against_baseline("map", inputs.predictors, "nll", _Planted(planted))
    assert (each, corrected) == ("4 / 1 of 5", "1 / 1 of 5")


def test_missing_nll_ranks_last() -> None:
    inputs = test_report._inputs()
    predictors = [
        dataclasses.replace(p, metrics={**p.metrics, "nll": math.nan}) if p.name == "swa" else p
        for p in inputs.predictors
    ]
    inputs = dataclasses.replace(inputs, predictors=predictors)
    assert [p.name for p in headline.ranking(inputs, compute(inputs))] == ["swag", "map", "swa"]


def test_only_a_better_nll_is_bold_in_the_ranking() -> None:
    inputs = test_report._inputs()
    planted = {("map", "swa"): {"nll": _iv("nll", "within noise")}}
    planted[("map", "swag")] = {"nll": _iv("nll", "worse")}
    rows = {r[1].text: r[4] for r in headline.ranking_table(inputs, _Planted(planted)).rows}
    assert (rows["swa"].text, rows["swa"].bold) == ("within noise", False)
    assert (rows["swag"].text, rows["swag"].bold) == ("worse", False)


# ----------------------------------------------------------------------------- baselines


def _by_statement(inputs: ReportInputs) -> dict[str, Claim]:
    return {c.statement: c for c in baselines.claims(inputs, compute(inputs))}


CLEAN = "MultiSWAG beats a deep ensemble of the same members on NLL"
SHIFT = "MultiSWAG's NLL advantage over the deep ensemble grows under shift"


def test_a_worse_nll_makes_a_baseline_claim_fail() -> None:
    inputs = test_report_seeds._inputs({0: {**test_report_seeds.STRONG, "multiswag": 1.0}})
    assert _by_statement(inputs)[CLEAN].holds is False


def test_swag_is_the_candidate_against_its_baselines() -> None:
    """'swag beats map_ts': swag is the stronger, so it holds."""
    inputs = _renamed(test_report_seeds._inputs({0: test_report_seeds.STRONG}), {"map": "map_ts"})
    claim = _by_statement(inputs)["swag beats map_ts on NLL"]
    assert claim.holds is True and claim.evidence.startswith("swag - map_ts on the test split")


def test_a_growth_whose_interval_holds_0_is_undecided() -> None:
    """A positive growth whose interval reaches below 0 decides nothing."""
    strength = {**test_report_seeds.STRONG, "multiswag": 2.0}
    inputs = test_report_seeds._inputs({0: strength}, shift_gain=0.1)
    _, ens, multi, _ = inputs.predictors
    value, low, _, _, _ = baselines.shift_growth(ens, multi, (500, 0))
    assert value > 0 > low
    found = _by_statement(inputs)
    assert found[SHIFT].holds is None
    # the clean comparison is within noise too: no images 'carry' a gain that is not there
    assert found[CLEAN].holds is None and "rests on" not in found[CLEAN].evidence


def test_the_growth_is_the_shifted_gap_minus_the_clean_one() -> None:
    """One shift: per image (NLL_ens - NLL_multi) shifted minus clean, and its 95%
    percentile interval over the shared resamples."""
    strength = {**test_report_seeds.STRONG, "multiswag": 2.0}
    inputs = test_report_seeds._inputs({0: strength}, shift_gain=1.5)
    _, ens, multi, _ = inputs.predictors

    def nll(p: PredictorResult, name: str) -> torch.Tensor:
        pred = p.predictions
        assert pred is not None and pred.shift_y is not None
        logp = torch.as_tensor(np.asarray(pred.shift_log_probs[name])).double()
        return -logp.gather(1, torch.as_tensor(pred.shift_y).long()[:, None])[:, 0]

    gap = {n: nll(ens, n) - nll(multi, n) for n in ("rotate_0", "shot_noise")}
    growth = gap["shot_noise"] - gap["rotate_0"]
    means = resample_counts(len(growth), 500, 0) @ growth / len(growth)
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64))
    value, *bounds, n_shifts, n = baselines.shift_growth(ens, multi, (500, 0))
    assert value == pytest.approx(float(growth.mean()))
    assert bounds == pytest.approx([float(low), float(high)])
    assert (n_shifts, n) == (1, len(growth))


def test_sampling_is_measured_against_multiswa_not_the_ensemble() -> None:
    """A MultiSWA that predicts what MultiSWAG does: the sampling adds nothing, undecided,
    however far MultiSWAG grows past the ensemble."""
    strength = {**test_report_seeds.STRONG, "multiswag": 2.0}
    inputs = test_report_seeds._inputs({0: strength}, shift_gain=1.5)
    multi = inputs.predictors[2]
    twin = dataclasses.replace(multi, name="multiswa", method="multiswa")
    inputs = dataclasses.replace(inputs, predictors=[*inputs.predictors, twin])
    found = _by_statement(inputs)
    assert found[SHIFT].holds is True
    (sampling,) = [c for s, c in found.items() if s.startswith("MultiSWAG's sampling")]
    assert sampling.holds is None and sampling.number == "gap growth +0.0000 [+0.0000, +0.0000]"


def test_the_share_without_sampling_is_multiswas_growth_over_multiswags() -> None:
    """A MultiSWA that predicts what the ensemble does grows by nothing: 0% of it."""
    strength = {**test_report_seeds.STRONG, "multiswag": 2.0}
    inputs = test_report_seeds._inputs({0: strength}, shift_gain=1.5)
    twin = dataclasses.replace(inputs.predictors[1], name="multiswa", method="multiswa")
    inputs = dataclasses.replace(inputs, predictors=[*inputs.predictors, twin])
    claim = _by_statement(inputs)[SHIFT]
    assert claim.holds is True and "[+0.0000, +0.0000] (0% of it) comes without" in claim.evidence


# --------------------------------------------------------------------------------- seeds


def test_a_seed_without_its_own_predictions_leaves_the_claim_undecided() -> None:
    """Seed 1 lacks swag's predictions: the pipeline seed's are not borrowed for it."""
    strong = test_report_seeds.STRONG
    inputs = test_report_seeds._inputs({0: strong, 1: strong})
    own, other = inputs.seeds
    lacking = {k: v for k, v in other.log_probs.items() if k != "swag"}
    inputs = dataclasses.replace(inputs, seeds=[own, dataclasses.replace(other, log_probs=lacking)])
    claim = seeds.seeds_claim(inputs, compute(inputs), "p", "swag", "map")
    assert claim is not None and claim.holds is None and "no per-seed test" in claim.number


def test_the_seed_mean_difference_is_candidate_minus_reference() -> None:
    """swag is the stronger: its NLL minus map's is negative in every seed."""
    strong = test_report_seeds.STRONG
    inputs = test_report_seeds._inputs({0: strong, 1: strong})
    diffs = [r.metrics["swag"]["nll"] - r.metrics["map"]["nll"] for r in inputs.seeds]
    claim = seeds.seeds_claim(inputs, compute(inputs), "p", "swag", "map")
    assert claim is not None and claim.holds is True and max(diffs) < 0
    mean, std = seeds.mean_std(diffs)
    assert claim.number == f"better in 2 of 2 seeds; NLL diff {mean:+.4f} ± {std:.4f}"


def test_the_seed_column_shows_the_pipeline_seed_wherever_it_is_listed() -> None:
    """Seeds listed 1 then 0, no predictions (no interval): the cell is seed 0's value."""
    strong = test_report_seeds.STRONG
    inputs = test_report_seeds._inputs({1: {**strong, "swag": 0.5}, 0: strong})
    bare = [dataclasses.replace(p, predictions=None) for p in inputs.predictors]
    inputs = dataclasses.replace(inputs, predictors=bare)
    table = seeds.table(inputs, compute(inputs))
    row = next(r for r in table.rows if r[0].text == "swag")
    (own,) = [r for r in inputs.seeds if r.seed == 0]
    cell = row[table.header.index("NLL seed 0 [95% CI]")]
    assert cell.text == f"{own.metrics['swag']['nll']:.4f}"


def test_the_seeds_section_claims_swag_against_its_baselines() -> None:
    """swag is the candidate in each BMA pair, multiswag against the ensemble."""
    strong = test_report_seeds.STRONG
    inputs = test_report_seeds._inputs({0: strong, 1: strong})
    found = {c.statement: c.holds for c in seeds.build(inputs, compute(inputs)).claims}
    assert found == {
        "multiswag beats ensemble on NLL in every seed": True,
        "swag beats map on NLL in every seed": True,
    }


# ----------------------------------------------------------------- config, on the bound


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("report.bootstrap", {"resamples": 1000, "seed": 0}),
        ("evaluate.ece_bins", 2),
        ("evaluate.plane.grid", 3),
        ("evaluate.plane.grid", 101),
        ("evaluate.dswag_sweep.target_accuracy", 1.0),
        ("evaluate.shift.angles", [0.0, 360.0]),
    ],
)
def test_a_value_on_its_bound_is_accepted(key: str, value: object) -> None:
    """Each inclusive bound (ALGORITHMS §10: at least 1,000 resamples) admits its end."""
    raw = yaml.safe_load((test_config.ROOT / "params.yaml").read_text())
    params = parse_params(test_config._with(raw, key, value))
    node: object = params
    for part in key.split("."):
        node = getattr(node, part)
    assert node == value or node.model_dump() == value  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("test", "val", "ok"), [(0.5, 0.4, True), (0.7, 0.2, True), (0.5, 0.41, False)]
)
def test_the_splits_leave_at_least_ten_percent_for_training(
    test: float, val: float, ok: bool
) -> None:
    """Exactly 10% left for training is accepted, whatever the sum's float rounding."""
    raw = yaml.safe_load((test_config.ROOT / "params.yaml").read_text())
    raw["data"].update(test_fraction=test, val_fraction=val)
    if ok:
        assert parse_params(raw).data.test_fraction == test
    else:
        with pytest.raises(UserError, match="must leave at least 10% for training"):
            parse_params(raw)
