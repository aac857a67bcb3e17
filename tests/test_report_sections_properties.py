"""Properties of the report's building blocks and sections that a mutation audit found no
test pinning down: the exact text of numbers, tables and sentences, which column holds
what, and the rules (ranks, verdicts, bins) behind them.

The sections are built from hand-made ``PredictorResult``s and an ``Uncertainty`` of
hand-made intervals, so no bootstrap runs and every expected string is known exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import matplotlib.colors
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from bayesavg.evaluation.metrics import ece, nll
from bayesavg.evaluation.selective import risk_coverage
from bayesavg.report import document, style
from bayesavg.report.blocks import (
    Bullets,
    Cell,
    Details,
    FigureBlock,
    Heading,
    Paragraph,
    Preformatted,
    Section,
    Table,
    TableBlock,
    bullets_or,
    figure,
    figure_section,
    walk,
)
from bayesavg.report.claims import Claim
from bayesavg.report.formats import fmt_or_dash, interval_text, pct, win_count, with_interval
from bayesavg.report.inputs import (
    SIGMA_KEYS,
    Predictions,
    PredictorResult,
    ReportInputs,
    SeedRun,
    SweepPoint,
    is_bayesian,
    is_closed_form,
    trajectory_params,
)
from bayesavg.report.intervals import Estimate, Interval
from bayesavg.report.render import to_html, to_markdown
from bayesavg.report.sections import (
    appendix,
    selective,
    setup,
    sharpness,
    training,
    variational,
)
from bayesavg.report.sections.calibration import (
    calibrated_table,
    calibration_claim,
    ensemble_curve,
    ranking_changes,
    reliability_layout,
)
from bayesavg.report.sections.metrics import geometry_table, metrics_note, metrics_table
from bayesavg.report.sections.samples import samples_layout
from bayesavg.report.sections.sharpness import Correlation, correlation, flat_calibrated_verdict
from bayesavg.report.sections.variational import sigma_figure, sigma_table
from bayesavg.report.sigma_curves import SigmaCurve, flat_range, sigma_curve_of
from bayesavg.report.uncertainty import (
    Comparison,
    Settings,
    Uncertainty,
    calibrated_comparison,
    compare,
    compared_pairs,
    estimates,
    settings,
    tempered,
)


def _result(
    name: str,
    method: str | None = None,
    trajectory: str = "swag",
    scale: float = 0.0,
    reliability: list[dict[str, float]] | None = None,
    by_samples: list[dict[str, float]] | None = None,
    **metrics: Any,
) -> PredictorResult:
    """A predictor named ``name`` (its method too, unless given) with these metrics."""
    return PredictorResult(
        name, method or name, trajectory, scale, metrics, reliability or [], by_samples or []
    )


def _inputs(predictors: list[PredictorResult], **kwargs: Any) -> ReportInputs:
    fields: dict[str, Any] = {"histories": {}, "params": {}, "runs": []}
    return ReportInputs("t", predictors, **(fields | kwargs))


def _interval(metric: str, diff: float, low: float, high: float) -> Interval:
    return Interval(metric, diff, low, high, 0.95, 2000)


def _unc(**kwargs: Any) -> Uncertainty:
    return Uncertainty(Settings(), **kwargs)


def _comparison(ref: str, cand: str, **intervals: Interval) -> Comparison:
    return Comparison(ref, cand, intervals, 1.0)


# --- formats -------------------------------------------------------------------------------


def test_win_count_names_wins_ties_and_missing_with_the_numbers() -> None:
    """Accuracy in percent at 2 decimals and its difference in pp; a tie is no win; a
    missing metric is named, not counted."""
    cand = _result("swa", accuracy=0.98, nll=0.14, ece=0.02)
    ref = _result("map", accuracy=0.975, nll=0.15, ece=0.02, brier=0.04)
    assert win_count(cand, ref, ("accuracy", "nll", "ece", "brier")) == (
        "swa beats map on 2 of 3 (accuracy, NLL); not on ECE (tied); "
        "not compared on Brier (missing): accuracy 98.00% vs 97.50% (+0.50 pp), "
        "NLL 0.1400 vs 0.1500 (-0.0100), ECE 0.0200 vs 0.0200 (+0.0000)"
    )


def test_interval_text_is_the_value_then_low_then_high() -> None:
    assert interval_text(0.0123, 0.004, 0.02) == "+0.0123 [+0.0040, +0.0200]"


def test_a_value_without_a_number_reads_n_a_with_or_without_an_interval() -> None:
    assert with_interval("nll", math.nan, None) == "n/a"
    estimate = Estimate("accuracy", 0.9, 0.88, 0.92, 0.95, 2000)
    assert with_interval("accuracy", 0.9, estimate) == "90.00 [88.00, 92.00]"


# --- blocks --------------------------------------------------------------------------------


def test_walk_visits_blocks_inside_nested_details_in_reading_order() -> None:
    inner = Paragraph("c")
    nested = Details("more", [inner])
    outer = Details("details", [Heading(3, "b"), nested])
    first = Paragraph("a")
    assert list(walk([first, outer])) == [first, outer, Heading(3, "b"), nested, inner]


def test_bullets_or_says_there_is_nothing_to_list() -> None:
    assert bullets_or([], "none found") == Paragraph("none found")
    assert bullets_or(["x"], "none found") == Bullets(["x"])


def test_a_figure_section_is_a_level_2_heading_the_figure_and_its_table() -> None:
    table = Table(["a"], [[Cell("1")]])
    assert figure_section("loss", b"png", "cap", table) == [
        Heading(2, "Figure: loss"),
        FigureBlock("loss", b"png", "cap"),
        TableBlock(table),
    ]
    assert figure_section("loss", None, "cap", table) == []


# --- sigma curves --------------------------------------------------------------------------


def test_sigma_curve_is_the_mean_min_and_max_per_sorted_multiple() -> None:
    rows = [
        {"multiple": 2.0, "accuracy": 0.5, "sigma_norm": 3.0},
        {"multiple": 0.0, "accuracy": 0.75, "sigma_norm": 4.0},
        {"multiple": 2.0, "accuracy": 0.25, "sigma_norm": 3.0},
        {"multiple": 0.0, "accuracy": 0.25},
    ]
    assert sigma_curve_of(rows) == SigmaCurve(
        [0.0, 2.0], [0.5, 0.375], [0.25, 0.25], [0.75, 0.5], 4.0
    )


def test_flat_range_keeps_a_drop_of_exactly_the_tolerance_and_stops_before_a_larger() -> None:
    """Powers of two, so 'exactly' is exact in floating point."""
    flat = SigmaCurve([0.0, 1.0, 2.0, 4.0], [0.5, 0.25, 0.25, 0.125], [0.0] * 4, [1.0] * 4, 1.0)
    assert flat_range(flat, tolerance=0.25) == 2.0


def test_flat_range_default_tolerance_is_one_accuracy_point() -> None:
    """A drop of 1/64 (1.6 points) is more than FLAT_TOLERANCE (1 point); 1/128 is less."""
    curve = SigmaCurve(
        [0.0, 1.0, 2.0], [0.5, 0.5 - 1 / 128, 0.5 - 1 / 64], [0.0] * 3, [1.0] * 3, 1.0
    )
    assert flat_range(curve) == 1.0


def test_flat_range_needs_the_m_0_row() -> None:
    curve = SigmaCurve([0.5, 1.0], [0.9, 0.9], [0.9, 0.9], [0.9, 0.9], 1.0)
    assert flat_range(curve) is None


# --- uncertainty ---------------------------------------------------------------------------


def _predicted(
    name: str, seed: int, y: np.ndarray, temperature: float | None = None
) -> PredictorResult:
    """A predictor with random per-point log-probabilities over 3 classes on labels ``y``."""
    logits = np.random.default_rng(seed).normal(size=(len(y), 3)) * 2
    logits[np.arange(len(y)), y] += 1.5
    log_probs = torch.log_softmax(torch.as_tensor(logits), dim=1).numpy()
    metrics = {"calibrated": {"temperature": temperature}} if temperature is not None else {}
    return PredictorResult(name, name, name, 0.0, metrics, [], [], Predictions(y, log_probs))


LABELS = np.random.default_rng(0).integers(0, 3, size=200)


def test_bootstrap_settings_come_from_params_else_the_defaults() -> None:
    found = settings({"report": {"bootstrap": {"resamples": 300, "seed": 7, "level": 0.9}}})
    assert found == Settings(resamples=300, seed=7, level=0.9)
    assert settings({"report": {"bootstrap": {"seed": 3}}}) == Settings(seed=3)


def test_a_predictors_ece_estimate_uses_20_bins() -> None:
    """ALGORITHMS §7: 20 equal-width bins (15 only beside it, for the libraries)."""
    p = _predicted("swag", 1, LABELS)
    lp = torch.as_tensor(p.predictions.log_probs)
    y = torch.as_tensor(LABELS)
    value = estimates(p, Settings(resamples=20))["ece"].value
    assert value == pytest.approx(float(ece(lp, y, 20)), abs=1e-12)
    assert float(ece(lp, y, 20)) != pytest.approx(float(ece(lp, y, 15)), abs=1e-6)


def test_a_predictor_is_not_compared_with_itself() -> None:
    p = _predicted("swag", 1, LABELS)
    assert _unc(predictors={"swag": p}).comparison("swag", "swag") is None


def test_pairs_on_other_labels_are_not_compared() -> None:
    ref = _predicted("map", 1, LABELS)
    other = _predicted("swag", 2, (LABELS + 1) % 3)
    assert compare(ref, other, Settings(resamples=20)) is None


def test_tempered_divides_the_log_probabilities_by_the_temperature() -> None:
    p = _predicted("swag", 1, LABELS, temperature=2.0)
    found = tempered(p)
    assert found is not None
    expected = torch.log_softmax(torch.as_tensor(p.predictions.log_probs) / 2.0, dim=1)
    assert torch.allclose(found[0], expected) and torch.equal(found[1], torch.as_tensor(LABELS))


def test_the_calibrated_comparison_is_candidate_minus_baseline() -> None:
    base = _predicted("map", 1, LABELS, temperature=1.5)
    cand = _predicted("swag", 2, LABELS, temperature=0.8)
    found = calibrated_comparison(base, cand, Settings(resamples=20))
    assert found is not None
    (ref_lp, y), (cand_lp, _) = tempered(base), tempered(cand)
    assert found.diff == pytest.approx(float(nll(cand_lp, y) - nll(ref_lp, y)), abs=1e-12)


def test_compared_pairs_are_every_predictor_against_the_baseline_then_other_pairs() -> None:
    """A given pair whose reference is the baseline is compared once, not twice."""
    ps = [_result("map"), _result("swa"), _result("swag")]
    pairs = [("map", "swag"), ("swa", "swag"), ("swag", "swag")]
    found = compared_pairs(_inputs(ps, pairs=pairs))
    assert [(r.name, c.name) for r, c in found] == [
        ("map", "swa"),
        ("map", "swag"),
        ("swa", "swag"),
    ]


# --- inputs --------------------------------------------------------------------------------


def test_a_missing_metric_is_nan_not_zero() -> None:
    assert math.isnan(_result("swag").metric("nll"))


def test_sigma_ratio_is_none_when_a_quantile_is_zero() -> None:
    """A zero has no place on the figure's log axis: the predictor is left out whole."""
    ratio = dict.fromkeys(SIGMA_KEYS, 1.0)
    assert _result("vi", sigma_ratio=ratio).sigma_ratio == ratio
    assert _result("vi", sigma_ratio=ratio | {"min": 0.0}).sigma_ratio is None


def test_trajectory_params_are_the_finetune_sections_that_are_mappings() -> None:
    params = {"finetune": {"swag": {"kind": "swag"}, "epochs": 3}, "seed": 0}
    assert trajectory_params(params) == {"swag": {"kind": "swag"}}
    assert trajectory_params({"finetune": 3}) == {}


def test_which_predictors_are_bayesian_and_which_closed_form() -> None:
    """Single networks are not Bayesian; the Laplace probit is, in closed form; an unknown
    method is taken to average."""
    bayesian = {m: is_bayesian(_result(m)) for m in ("map", "swa", "swag", "laplace", "new")}
    assert bayesian == {"map": False, "swa": False, "swag": True, "laplace": True, "new": True}
    closed = {m: is_closed_form(_result(m)) for m in ("map", "swag", "laplace", "new")}
    assert closed == {"map": False, "swag": False, "laplace": True, "new": False}


def test_a_sweep_points_metric_reads_integers_and_says_nan_for_what_is_missing() -> None:
    point = SweepPoint(2, 5, None, 0.9, 4, {"dswag": {"accuracy": 1, "nll": None}}, [], [])
    assert point.metric("dswag", "accuracy") == 1.0
    assert math.isnan(point.metric("dswag", "nll"))
    assert math.isnan(point.metric("fedavg", "accuracy"))


# --- style ---------------------------------------------------------------------------------


def _family_inputs() -> ReportInputs:
    """map (baseline), the SWAG family with an F-variant, and a chain grown from dswag."""
    finetune = {
        "swag": {"kind": "swag"},
        "fswag": {"kind": "swag", "sam_rho": 0.05},
        "plain": {"kind": "swag", "sam_rho": 0.0},
        "dswag": {"kind": "dswag"},
        "fedavg_swag": {"kind": "swag", "start": "dswag"},
        "later": {"kind": "swag", "start": "fedavg_swag"},
    }
    ps = [
        _result("map", trajectory="pretrain"),
        _result("swa", trajectory="swag"),
        _result("swag", trajectory="swag"),
        _result("fswag", method="swag", trajectory="fswag"),
        _result("swag_diag", trajectory="plain"),
        _result("later_swag", method="swag", trajectory="later"),
    ]
    return _inputs(ps, params={"finetune": finetune}, pairs=[("swag", "fswag")])


def test_families_leave_out_the_baseline_and_follow_dswag_chains() -> None:
    inputs = _family_inputs()
    found = {title: [p.name for p in ps] for title, ps in style.families(inputs).items()}
    assert found == {
        "SWA / SWAG": ["swa", "swag", "fswag", "swag_diag"],
        style.DISTRIBUTED: ["later_swag"],
    }


def test_an_f_variant_takes_its_references_colour_the_others_one_each() -> None:
    inputs = _family_inputs()
    colours = style.colours(inputs)
    tab = style.TAB10
    assert colours["map"] == style.BASELINE_COLOUR
    assert [colours[n] for n in ("swa", "swag", "fswag", "swag_diag")] == [
        tab[0],
        tab[1],
        tab[1],
        tab[2],
    ]


def test_line_styles_dotted_baseline_dashed_f_variants_solid_otherwise() -> None:
    inputs = _family_inputs()
    by_name = {p.name: p for p in inputs.predictors}
    found = {n: style.linestyle(by_name[n], inputs) for n in ("map", "swag", "fswag", "swag_diag")}
    assert found == {"map": ":", "swag": "-", "fswag": "--", "swag_diag": "-"}


def test_main_predictors_lead_with_the_baseline_when_it_has_predictions() -> None:
    ps = [_predicted(n, i, LABELS) for i, n in enumerate(("map", "swag", "other"))]
    ps[1] = dataclasses.replace(ps[1], method="swag")
    found = style.main_predictors(_inputs(ps))
    assert [p.name for p in found] == ["map", "swag"]


# --- sections: calibration -----------------------------------------------------------------


def _calibrated(t: float, nll: float, ece: float, brier: float) -> dict[str, float]:
    return {"temperature": t, "nll": nll, "ece": ece, "brier": brier}


def _calibration_case() -> tuple[ReportInputs, Uncertainty]:
    """map (baseline); swag better on raw NLL, within noise once calibrated; swa and vi
    within noise both ways."""
    ps = [
        _result(
            "map",
            ece=0.05,
            ece15=0.045,
            ece_adaptive=0.04,
            ece_classwise=0.01,
            nll=0.3,
            calibrated=_calibrated(1.5, 0.25, 0.02, 0.1),
        ),
        _result(
            "swag",
            ece=0.03,
            ece15=0.028,
            ece_adaptive=0.027,
            ece_classwise=0.008,
            nll=0.2,
            calibrated=_calibrated(1.2, 0.26, 0.015, 0.09),
        ),
        _result("swa", ece=0.04, nll=0.28, calibrated=_calibrated(0.9, 0.22, 0.01, 0.08)),
        _result("vi", ece=0.04, nll=0.29, calibrated=_calibrated(1.0, 0.27, 0.01, 0.08)),
    ]
    noise = _interval("nll", -0.01, -0.03, 0.01)
    unc = _unc(
        comparisons={
            ("map", "swag"): _comparison("map", "swag", nll=_interval("nll", -0.1, -0.15, -0.05)),
            ("map", "swa"): _comparison("map", "swa", nll=noise),
            ("map", "vi"): _comparison("map", "vi", nll=noise),
        },
        calibrated_vs_baseline={"swag": noise, "swa": noise, "vi": noise},
    )
    return _inputs(ps), unc


def test_the_calibrated_table_puts_each_number_in_its_column() -> None:
    """The verdict column reads raw → calibrated, bold where calibration changed it."""
    inputs, unc = _calibration_case()
    table = calibrated_table(inputs, unc)
    assert table.header[1:] == [
        "ECE [95% CI]",
        "ECE (15 bins)",
        "adaptive ECE",
        "classwise ECE",
        "T (val)",
        "calibrated NLL [95% CI]",
        "calibrated ECE",
        "calibrated Brier",
        "DEE",
        "NLL vs map: raw → calibrated",
    ]
    texts = {row[0].text: [c.text for c in row[1:]] for row in table.rows[:3]}
    assert texts["map"] == [
        *("0.0500", "0.0450", "0.0400", "0.0100", "1.500"),
        *("0.2500", "0.0200", "0.1000", "n/a", "baseline"),
    ]
    assert texts["swag"] == [
        *("0.0300", "0.0280", "0.0270", "0.0080", "1.200"),
        *("0.2600", "0.0150", "0.0900", "n/a", "better → within noise"),
    ]
    assert texts["swa"] == [
        *("0.0400", "n/a", "n/a", "n/a", "0.900"),
        *("0.2200", "0.0100", "0.0800", "n/a", "within noise → within noise"),
    ]
    assert [row[-1].bold for row in table.rows] == [False, True, False, False]


def test_the_calibration_claim_counts_the_verdicts_kept() -> None:
    inputs, unc = _calibration_case()
    claim = calibration_claim(inputs, unc)
    assert claim is not None and claim.holds is False and claim.number == "2/3 kept"
    assert claim.evidence.startswith("2 of 3 NLL comparisons with map keep their verdict")
    assert claim.evidence.endswith("; changed: swag (better → within noise).")


def test_ranking_changes_are_one_based_ranks_by_nll_and_by_calibrated_nll() -> None:
    inputs, _ = _calibration_case()
    assert ranking_changes(inputs) == [("swag", 1, 3), ("swa", 2, 1), ("vi", 3, 4), ("map", 4, 2)]


def _bins(gap: float) -> list[dict[str, float]]:
    """Four bins of width 1/4: the first empty, the others at their centre plus ``gap``."""
    rows = []
    for i in range(4):
        count = 0 if i == 0 else 10
        conf = (i + 0.5) / 4 if count else 0.0
        acc = conf + gap if count else 0.0
        rows.append({"lower": i / 4, "upper": (i + 1) / 4, "confidence": conf, "accuracy": acc})
        rows[-1]["count"] = count
    return rows


def test_the_reliability_panel_draws_accuracy_minus_confidence_of_non_empty_bins() -> None:
    """Above 0 is under-confident (ALGORITHMS §8: the DSWAG paper has the sign backwards)."""
    ps = [
        _result("map", reliability=_bins(-0.125), ece=0.125),
        _result("swag", reliability=_bins(0.0625), ece=0.0625),
    ]
    fig = reliability_layout(_inputs(ps))
    assert fig is not None
    ax = fig.axes[0]
    drawn = {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.lines
        if not line.get_label().startswith("_")
    }
    centres = [0.375, 0.625, 0.875]
    assert drawn == {
        "map (ECE 0.125)": (centres, [-0.125] * 3),
        "swag (ECE 0.062)": (centres, [0.0625] * 3),
    }
    assert ax.get_ylabel() == "accuracy - confidence"


# --- sections: metrics ---------------------------------------------------------------------


def _metrics_case() -> tuple[list[PredictorResult], Uncertainty]:
    ps = [
        _result("map", accuracy=0.9, nll=0.3, ece=0.05, brier=0.15, n_samples=1.0),
        _result(
            "swag",
            scale=0.5,
            accuracy=0.91,
            nll=0.25,
            ece=0.06,
            brier=0.14,
            n_samples=30.0,
            sharpness=0.01234,
            hessian_trace=123.456,
            hessian_trace_se=4.567,
        ),
        _result("vi", scale=0.5, accuracy=0.88, nll=0.35, ece=0.03, brier=0.16, hessian_trace=50.0),
    ]
    estimate = Estimate("accuracy", 0.91, 0.9, 0.92, 0.9, 1000)
    return ps, Uncertainty(Settings(1000, 3, 0.9), estimates={"swag": {"accuracy": estimate}})


def test_the_metrics_table_bolds_each_columns_best_and_hides_a_meaningless_scale() -> None:
    """Higher accuracy, lower NLL, ECE and Brier is best; VI's scale changes nothing: '-'."""
    ps, unc = _metrics_case()
    table = metrics_table(ps, unc)
    assert table.header == [
        *("Predictor", "Trajectory", "Scale", "Accuracy (%)", "NLL", "ECE (20 bins)"),
        *("Brier", "Samples"),
    ]
    cells = {row[0].text: [(c.text, c.bold) for c in row[2:]] for row in table.rows}
    assert cells["map"] == [
        *(("-", False), ("90.00", False), ("0.3000", False), ("0.0500", False)),
        *(("0.1500", False), ("1", False)),
    ]
    assert cells["swag"] == [
        *(("0.5", False), ("91.00 [90.00, 92.00]", True), ("0.2500", True), ("0.0600", False)),
        *(("0.1400", True), ("30", False)),
    ]
    assert cells["vi"] == [
        *(("-", False), ("88.00", False), ("0.3500", False), ("0.0300", True)),
        *(("0.1600", False), ("n/a", False)),
    ]


def test_the_metrics_note_gives_the_level_and_names_predictors_without_intervals() -> None:
    ps, unc = _metrics_case()
    note = metrics_note(ps, unc)
    assert note.startswith(
        "Each metric on the test split with its 90% percentile bootstrap interval in "
        "brackets (1000 resamples of the test points, seed 3);"
    )
    assert note.endswith(
        " No interval for map, vi: their per-point predictions (predictions/<name>.npz) "
        "were not given, so only the value is shown."
    )


def test_the_geometry_table_lists_a_predictor_with_either_measure() -> None:
    ps, _ = _metrics_case()
    table = geometry_table(ps)
    assert table is not None
    assert table.header == ["Predictor", "Sharpness (SAM)", "tr(H)"]
    assert [[c.text for c in row] for row in table.rows] == [
        ["swag", "0.0123", "123.5 ± 4.6"],
        ["vi", "n/a", "50"],
    ]


# --- sections: setup and appendix ----------------------------------------------------------


def _setup_case(**kwargs: Any) -> ReportInputs:
    ps = [
        _result("map", trajectory="pretrain", temperature=1.5),
        _result("swag", scale=0.5),
        _result("vi", trajectory="vi"),
        _result("odd", method="newthing", trajectory="x"),
    ]
    finetune = {"pretrain": {"vi": {"lr": 0.1}}, "vi": {"vi": {"kl_weight": 0.1}}}
    fields = {
        "params": {"seed": 4, "finetune": finetune},
        "dataset_summary": {"dataset": "mnist5k", "train": 3600, "test": 1000},
    }
    return _inputs(ps, **(fields | kwargs))


def test_the_setup_summary_describes_data_predictors_baseline_and_what_intervals_rest_on() -> None:
    assert setup.summary(_setup_case()) == (
        "Dataset mnist5k (train=3600, test=1000). Predictors: map (the fine-tuned point "
        "estimate, trajectory pretrain, temperature-scaled: T = 1.5 fitted on val); swag "
        "(SWAG with a low-rank plus diagonal Gaussian, trajectory swag, scale 0.5); vi (the "
        "last mean-field VI iterate, trajectory vi, tempered: KL weight 0.1, not the true "
        "ELBO); odd (method newthing, trajectory x). Each is compared with the baseline map; "
        "lower is better for NLL, ECE and Brier, higher for accuracy. Every interval rests on "
        "the 1000 test points of one training seed (seed 4): it measures how the metric varies "
        "over test points, not over reruns. One seed: set seeds: [0, 1, 2] for mean ± std over "
        "reruns (README)."
    )


def test_the_setup_summary_over_one_or_more_seeds_and_without_a_seed() -> None:
    one = setup.summary(_setup_case(seeds=[SeedRun(0, {})]))
    assert one.endswith(" One seed: set seeds: [0, 1, 2] for mean ± std over reruns (README).")
    two = setup.summary(_setup_case(seeds=[SeedRun(0, {}), SeedRun(1, {})]))
    assert two.endswith(
        " Over seeds: mean ± std of 2 seeds (0, 1), each comparison also decided in every "
        "seed's paired test (section 'Results over seeds')."
    )
    unseeded = setup.summary(_setup_case(params={}, dataset_summary={"test": 10}))
    assert unseeded.startswith("Dataset (test=10). ")
    assert unseeded.endswith("lower is better for NLL, ECE and Brier, higher for accuracy.")
    bare = setup.summary(_setup_case(dataset_summary={"dataset": "x"}))
    assert bare.startswith("Dataset x: no summary given. Predictors: ")


def test_the_intervals_line_gives_level_resamples_and_seed() -> None:
    line = setup.intervals_line(Uncertainty(Settings(1000, 3, 0.9)))
    assert line.startswith(
        " Intervals: 90% bootstrap over the test points (1000 resamples, seed 3);"
    )


def test_the_parameters_appear_in_their_own_order_as_yaml() -> None:
    """params.yaml's order, not sorted: the reader finds a key where the file has it."""
    inputs = _inputs([_result("map")], params={"b": 1, "a": {"z": 1, "y": 2}})
    blocks = appendix.build(inputs, _unc()).blocks
    assert Preformatted("b: 1\na:\n  z: 1\n  y: 2\n", "yaml") in blocks


# --- sections: selective -------------------------------------------------------------------


def _selective_case() -> tuple[ReportInputs, Uncertainty]:
    ps = [
        _result("map", aurc=0.05, augrc=0.02, risk_at_90=0.04, risk_at_95=0.06),
        _result("swag", aurc=0.03, augrc=0.01, risk_at_90=0.02, risk_at_95=0.03),
        _result("vi", aurc=0.07),
        _result("hwa", aurc=0.051),
        _result("swa"),
    ]
    unc = _unc(
        comparisons={
            ("map", "swag"): _comparison(
                "map", "swag", aurc=_interval("aurc", -0.02, -0.03, -0.01)
            ),
            ("map", "vi"): _comparison("map", "vi", aurc=_interval("aurc", 0.02, 0.01, 0.03)),
            ("map", "hwa"): _comparison("map", "hwa", aurc=_interval("aurc", 0.001, -0.01, 0.01)),
        }
    )
    return _inputs(ps), unc


def test_the_selective_table_columns_and_verdicts() -> None:
    """Risk at 90% before 95% coverage; the AURC difference to the baseline with its
    verdict, bold only where lower beyond noise."""
    inputs, unc = _selective_case()
    table = selective.table(inputs, unc)
    assert table.header == [
        *("Predictor", "AURC", "AUGRC", "error at 90% coverage", "error at 95% coverage"),
        *("AURC - map [95% CI]", "vs map"),
    ]
    rows = {row[0].text: [(c.text, c.bold) for c in row[1:]] for row in table.rows}
    assert [text for text, _ in rows["map"]] == [
        "0.0500",
        "0.0200",
        "0.0400",
        "0.0600",
        "",
        "baseline",
    ]
    assert rows["swag"][4:] == [("-0.0200 [-0.0300, -0.0100]", False), ("better", True)]
    assert rows["vi"][4:] == [("+0.0200 [+0.0100, +0.0300]", False), ("worse", False)]
    assert rows["hwa"][4:] == [("+0.0010 [-0.0100, +0.0100]", False), ("within noise", False)]
    assert rows["swa"][4:] == [("n/a", False), ("no per-point predictions", False)]


def test_the_selective_summary_names_the_lowest_aurc_and_who_beats_the_baseline() -> None:
    inputs, unc = _selective_case()
    assert selective.summary(inputs, unc).startswith(
        "Lowest AURC: swag (0.0300). By the paired interval of the AURC difference, "
        "1 predictor(s) have a lower AURC than map (swag) and 1 a higher one (vi); "
        "the rest are within noise."
    )


def test_risk_coverage_is_drawn_in_percent_each_predictor_in_a_colour_not_grey() -> None:
    """The baseline alone is grey: tab10's grey is skipped even with eight others."""
    names = ["map", "swa", "swag", "multiswag", "ensemble", "laplace", "mc_dropout", "vi", "hwa"]
    ps = [_predicted(n, i, LABELS) for i, n in enumerate(names)]
    fig = selective.curves_figure(_inputs(ps))
    assert fig is not None
    full, zoomed = fig.axes[:2]
    assert zoomed.get_title() == "coverage 0.8 to 1"
    assert full.get_ylabel() == "error among kept points (%)"
    lines = {line.get_label(): line for line in full.lines}
    lp = torch.as_tensor(ps[2].predictions.log_probs)
    coverage, risk = risk_coverage(lp, torch.as_tensor(LABELS))
    np.testing.assert_allclose(lines["swag"].get_ydata(), 100 * risk.numpy())
    np.testing.assert_allclose(lines["swag"].get_xdata(), coverage.numpy())
    colours = [matplotlib.colors.to_hex(lines[n].get_color()) for n in names]
    assert colours[0] == matplotlib.colors.to_hex(style.BASELINE_COLOUR)
    assert len(set(colours)) == len(names)
    assert matplotlib.colors.to_hex(style.TAB10[7]) not in colours


# --- sections: sharpness -------------------------------------------------------------------


def _correlation(rho: float, p: float) -> Correlation:
    return Correlation("sharpness", "ece", rho, p, 6, 6)


def test_the_flat_calibrated_rule_at_its_bounds() -> None:
    """Holds: every rho >= MIN_RHO (0.3) with p < 0.05; fails: none positive (0 is not)."""
    assert sharpness.MIN_RHO == 0.3
    assert flat_calibrated_verdict([_correlation(0.3, 0.04), _correlation(0.9, 0.001)]) is True
    assert flat_calibrated_verdict([_correlation(0.25, 0.001)]) is None
    assert flat_calibrated_verdict([_correlation(0.0, 0.5), _correlation(-0.2, 0.9)]) is False


def test_a_correlation_needs_three_predictors_with_a_positive_measure() -> None:
    ps = [_result(f"p{i}", sharpness=s, ece=0.01 * i) for i, s in enumerate((0.0, 0.1, 0.2))]
    assert correlation(ps, "sharpness", "ece") is None  # two with sharpness > 0
    found = correlation([*ps, _result("p3", sharpness=0.3, ece=0.05)], "sharpness", "ece")
    assert found is not None and (found.n, found.networks, found.rho) == (3, 3, 1.0)


def test_a_holding_rule_is_decided_by_its_weakest_correlation() -> None:
    nll = [0.1, 0.3, 0.2, 0.4, 0.5, 0.6, 0.7]
    ps = [_result(f"p{i}", hessian_trace=i + 1.0, ece=0.01 * (i + 1), nll=nll[i]) for i in range(7)]
    trace = sharpness.claims(_inputs(ps))[1]
    assert trace.holds is True
    assert trace.number == "rho(tr(H), NLL) +0.96, p 0.001, n 7 at 7 networks"


def test_the_sharpness_section_names_the_strongest_correlation_by_its_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rho of -1 is stronger than one of +0.8; a predictor without sharpness is left out."""
    monkeypatch.setattr(style, "png", lambda fig: b"png")  # the figure is not the point
    values = [(0.1, 0.04, 0.3), (0.2, 0.03, 0.2), (0.3, 0.02, 0.4), (0.4, 0.01, 0.5)]
    ps = [_result(f"p{i}", sharpness=s, ece=e, nll=n) for i, (s, e, n) in enumerate(values)]
    ps.append(_result("flat", sharpness=0.0, ece=0.5, nll=0.5))
    blocks = sharpness.build(_inputs(ps), _unc()).blocks
    assert blocks[1] == Paragraph(
        "The strongest rank correlation is between sharpness and ECE (rho = -1.00 over 4 "
        "predictors at 4 networks: predictors measured at one network, such as swa, swag_diag "
        "and swag at the snapshot mean, share its sharpness, and the permutation test moves "
        "them together)."
    )
    (table,) = [b.table for b in blocks if isinstance(b, TableBlock)]
    assert table.header == [
        *("Sharpness", "Metric", "Spearman rho", "Permutation p (rho ≥ observed)"),
        "Predictors (networks)",
    ]
    assert [[c.text for c in row] for row in table.rows] == [
        ["sharpness", "ece", "-1.000", "1.000", "4 (4)"],
        ["sharpness", "nll", "+0.800", "0.167", "4 (4)"],
    ]


# --- sections: training --------------------------------------------------------------------


def _history(epochs: int, **extra: float) -> list[dict[str, float]]:
    return [
        {"epoch": e, "train_loss": 1 / e, "val_loss": 0.5, "train_accuracy": 0.8}
        | {"val_accuracy": 0.7, **extra}
        for e in range(1, epochs + 1)
    ]


def _training_case() -> ReportInputs:
    """pretrain (3 epochs); swag; vi then hwa from it; dswag from a fresh network; laplace
    (trains nothing) from swag; late from a run without a history."""
    finetune = {
        "swag": {"kind": "swag"},
        "vi": {"kind": "vi"},
        "hwa": {"kind": "hwa", "start": "vi"},
        "dswag": {"kind": "dswag", "start": "init"},
        "laplace": {"kind": "laplace", "start": "swag"},
        "source": {"kind": "swag", "epochs": 7},
        "late": {"kind": "swag", "start": "source"},
    }
    ps = [
        _result("map", trajectory="pretrain"),
        _result("swag"),
        _result("vi", trajectory="vi"),
        _result("hwa", trajectory="hwa"),
        _result("dswag", trajectory="dswag"),
        _result("laplace", trajectory="laplace"),
    ]
    histories = {
        "pretrain": _history(3),
        "swag": _history(2),
        "vi": _history(4, test_accuracy=0.5, avg_test_accuracy=0.625),
        "hwa": _history(2),
        "dswag": _history(5),
        "laplace": [{"epoch": 0, "val_loss": 0.4, "val_accuracy": 0.9}],
    }
    return _inputs(ps, histories=histories, params={"finetune": finetune})


def test_training_rows_split_negative_elbo_runs_from_cross_entropy_ones() -> None:
    """Pretraining is in every row, never a row of its own; VI and HWA share an ELBO row."""
    inputs = _training_case()
    rows = training._training_rows(inputs, trajectory_params(inputs.params))
    assert rows == [
        ("SWA / SWAG", False, ["swag"]),
        ("VI / HWA (negative ELBO)", True, ["vi", "hwa"]),
        ("Laplace", False, ["laplace"]),
        (style.DISTRIBUTED, False, ["dswag"]),
    ]


def test_a_run_starts_after_the_runs_it_continues_and_a_fresh_one_at_0() -> None:
    """Offsets on the figure's epoch axis: pretraining's 3 epochs, then each start's epochs
    (its history's, else its ``epochs`` param); ``start: init`` begins beside pretraining."""
    inputs = _training_case()
    trajectories = trajectory_params(inputs.params)
    names = ("swag", "hwa", "dswag", "laplace", "late")
    found = {n: training.run_offset(n, trajectories, inputs.histories) for n in names}
    assert found == {"swag": 3.0, "hwa": 7.0, "dswag": 0.0, "laplace": 5.0, "late": 10.0}


class _Counted(dict):
    """Trajectory params that fail a test looping over them more than 100 times."""

    looked = 0

    def __contains__(self, key: object) -> bool:
        type(self).looked += 1
        assert type(self).looked < 100, "the start chain was followed round a cycle"
        return super().__contains__(key)


def test_a_cycle_of_starts_is_followed_once() -> None:
    trajectories = _Counted(a={"start": "b", "epochs": 2}, b={"start": "a", "epochs": 3})
    assert training.epoch_offset("a", trajectories, {}) == 3.0


def test_the_training_figure_labels_elbo_rows_and_runs_that_train_nothing() -> None:
    inputs = _training_case()
    fig = training.training_layout(inputs)
    assert fig is not None
    axes = fig.axes
    titles = [ax.get_title() for ax in axes[:12]]
    elbo = titles.index("VI / HWA (negative ELBO): train loss")
    assert axes[elbo].get_ylabel() == "negative ELBO per point"
    # vi, hwa and the line at the end of pretraining, but not pretraining's cross-entropy
    assert len(axes[elbo].lines) == 3
    assert axes[titles.index("SWA / SWAG: train loss")].get_ylabel() == "cross-entropy"
    laplace = axes[titles.index("Laplace: accuracy")]
    assert "laplace (no training)" in [line.get_label() for line in laplace.lines]


def test_the_finetune_curves_show_accuracy_in_percent_after_pretraining(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    figures: list[Figure] = []
    monkeypatch.setattr(style, "png", lambda fig: figures.append(fig) or b"png")
    assert training.finetune_curves_figure(_training_case()) == b"png"
    accuracy = figures[0].axes[2]
    drawn = {line.get_label(): list(line.get_ydata()) for line in accuracy.lines}
    assert drawn == {"vi": [50.0] * 4, "vi average": [62.5] * 4}
    assert list(accuracy.lines[0].get_xdata()) == [1, 2, 3, 4]


# --- sections: variational and samples -----------------------------------------------------


def _ratio(scale: float) -> dict[str, float]:
    quantiles = (0.1, 0.2, 0.3, 0.4, 0.4567, 0.6, 0.7123, 0.8, 0.9)
    return {k: scale * q for k, q in zip(SIGMA_KEYS, quantiles, strict=False)} | {
        "mean": scale * 0.55
    }


def test_the_sigma_table_gives_the_median_and_the_middle_80_percent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(style, "png", lambda fig: b"png")
    ps = [_result("vi", sigma_ratio=_ratio(1.0)), _result("map")]
    table = sigma_table(ps)
    assert table == Table(
        ["Predictor", "Median sigma/sigma_0", "p10 to p90"],
        [[Cell("vi"), Cell("0.457"), Cell("0.3 to 0.712")]],
    )
    blocks = variational.build(_inputs(ps), _unc()).blocks
    assert blocks[-1] == TableBlock(table)


def test_the_sigma_boxes_span_p25_p75_with_whiskers_to_p01_and_p99(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    figures: list[Figure] = []
    monkeypatch.setattr(style, "png", lambda fig: figures.append(fig) or b"png")
    assert sigma_figure([_result("vi", sigma_ratio=_ratio(1.0))]) == b"png"
    ax = figures[0].axes[0]
    at_one = [tuple(float(y) for y in line.get_ydata()) for line in ax.lines]
    assert (0.4, 0.2) in at_one and (0.6, 0.8) in at_one  # whiskers: p25 to p01, p75 to p99
    assert (0.4, 0.4, 0.6, 0.6, 0.4) in at_one  # the box
    assert ax.get_yscale() == "log"


def _samples(n: int, accuracy: float) -> list[dict[str, float]]:
    return [
        {"samples": s, "nll": 0.3 - 0.01 * s, "accuracy": accuracy, "ece": 0.02}
        for s in range(1, n + 1)
    ]


def test_no_samples_figure_when_only_the_baseline_averages() -> None:
    ps = [
        _result("map", by_samples=_samples(3, 0.9)),
        _result("swa", by_samples=_samples(1, 0.9)),
    ]
    assert samples_layout(_inputs(ps)) is None


def test_the_samples_figure_draws_accuracy_in_percent_and_one_sample_as_a_level() -> None:
    ps = [
        _result("map", by_samples=_samples(1, 0.875)),
        _result("swag", by_samples=_samples(3, 0.9375)),
    ]
    fig = samples_layout(_inputs(ps))
    assert fig is not None
    accuracy = fig.axes[1]
    assert accuracy.get_title() == "SWA / SWAG: accuracy (%)"
    lines = {line.get_label(): line for line in accuracy.lines}
    assert list(lines["swag"].get_xdata()) == [1, 2, 3]
    assert list(lines["swag"].get_ydata()) == [93.75] * 3
    assert list(lines["map"].get_xdata()) == [0, 1]  # axhline: across the whole axis
    assert list(lines["map"].get_ydata()) == [87.5, 87.5]


# --- document and render -------------------------------------------------------------------


def _claim(name: str) -> Claim:
    return Claim("paper", f"claim {name}", True, "evidence", "number")


def _stub(name: str) -> Callable[[ReportInputs, Uncertainty], Section]:
    def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
        return Section([Paragraph(f"section {name}")], [_claim(name)])

    return build


def test_the_document_is_title_headline_then_the_sections_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The headline comes first and checks every section's claims, the last one's too."""
    names = "abcdefg"
    seen: list[Claim] = []

    def headline(inputs: ReportInputs, unc: Uncertainty, claims: list[Claim]) -> Section:
        seen.extend(claims)
        return Section([Paragraph("headline")])

    monkeypatch.setattr(document, "BODY", tuple(_stub(n) for n in names))
    monkeypatch.setattr(document, "compute", lambda inputs: _unc())
    monkeypatch.setattr(document.headline, "build", headline)
    monkeypatch.setattr(document.parallel, "fork_map", lambda fn, items: [fn(i) for i in items])
    blocks = document.build(dataclasses.replace(_inputs([]), title="Report"))
    assert blocks == [
        Heading(1, "Report"),
        Paragraph("headline"),
        *(Paragraph(f"section {n}") for n in names),
    ]
    assert seen == [_claim(n) for n in names]


def test_the_report_opens_with_the_setup_and_closes_with_the_appendix() -> None:
    from bayesavg.report.sections import metrics

    assert document.BODY[:2] == (setup.build, metrics.build)
    assert document.BODY[-1] is appendix.build


def test_verbatim_text_ending_in_a_newline_is_fenced_without_a_blank_line() -> None:
    """Parameters are YAML, which ends with a newline."""
    md = to_markdown([Heading(1, "t"), Preformatted("seed: 0\nlr: 0.1\n", "yaml")])
    assert "```yaml\nseed: 0\nlr: 0.1\n```\n" in md


# --- more: the second round of mutants -----------------------------------------------------


def test_percentages_and_dashes_are_written_at_their_stated_precision() -> None:
    assert pct(0.12345) == "12.35%"
    assert fmt_or_dash(0.123456) == "0.1235"
    assert fmt_or_dash(math.nan) == "-"


def test_a_figure_inside_a_section_has_no_heading_of_its_own() -> None:
    assert figure("risk", b"png", "cap") == [FigureBlock("risk", b"png", "cap")]
    assert figure("risk", None, "cap") == []


def test_the_page_title_is_the_level_1_heading() -> None:
    page = to_html([Heading(2, "Setup"), Heading(1, "The report")])
    assert "<title>The report</title>" in page


def test_the_dee_curve_is_the_deep_ensembles_not_another_predictors() -> None:
    """Only method ``ensemble`` has member counts 1..M; a MultiSWAG listed first with the
    same column is not it."""
    multi = [{"samples": s, "nll_calibrated": 0.5} for s in (1, 2)]
    members = [{"samples": s, "nll_calibrated": 0.4 - 0.1 * s} for s in (1, 2, 3)]
    ps = [
        _result("multiswag", by_samples=multi),
        _result("deep", method="ensemble", by_samples=members),
    ]
    name, values = ensemble_curve(_inputs(ps))
    assert name == "deep" and values == pytest.approx([0.3, 0.2, 0.1])


def test_the_rule_needs_p_strictly_below_0_05_and_counts_distinct_networks() -> None:
    assert flat_calibrated_verdict([_correlation(0.9, 0.05)]) is None
    ps = [_result(f"p{i}", sharpness=s, ece=0.01 * i) for i, s in enumerate((0.1, 0.1, 0.2, 0.3))]
    found = correlation(ps, "sharpness", "ece")
    assert found is not None and (found.n, found.networks) == (4, 3)


def test_a_mixed_rule_is_decided_by_the_first_correlation_that_misses_the_bar() -> None:
    """Undecided: the number shown is the first correlation below the bar, not the first."""
    found = [_correlation(0.9, 0.001), _correlation(0.1, 0.4), _correlation(0.2, 0.3)]
    assert sharpness._deciding(found, None) is found[1]


def test_the_finetune_curves_continue_after_the_run_they_start_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hwa after vi's 4 epochs: epochs since the end of pretraining."""
    figures: list[Figure] = []
    monkeypatch.setattr(style, "png", lambda fig: figures.append(fig) or b"png")
    inputs = _training_case()
    hwa = _history(2, test_accuracy=0.5)
    inputs = dataclasses.replace(inputs, histories=inputs.histories | {"hwa": hwa})
    training.finetune_curves_figure(inputs)
    lines = {line.get_label(): list(line.get_xdata()) for line in figures[0].axes[2].lines}
    assert lines["vi"] == [1, 2, 3, 4] and lines["hwa"] == [5, 6]


def test_every_mlflow_run_has_its_filter_row_under_a_level_2_heading() -> None:
    inputs = _inputs([_result("map")], runs=["pretrain", "evaluate@map"])
    blocks = appendix.build(inputs, _unc()).blocks
    assert Heading(2, "MLflow runs") in blocks
    (table,) = [b.table for b in blocks if isinstance(b, TableBlock)]
    texts = [row[0].text for row in table.rows]
    assert texts == ["attributes.run_name = 'pretrain'", "attributes.run_name = 'evaluate@map'"]


def test_the_family_order_puts_distributed_before_other() -> None:
    inputs = _family_inputs()
    extra = _result("odd", method="newthing", trajectory="swag")
    inputs = dataclasses.replace(inputs, predictors=[*inputs.predictors, extra])
    assert list(style.families(inputs))[-2:] == [style.DISTRIBUTED, style.OTHER]


def test_without_main_predictors_each_family_shows_an_averaging_one_first() -> None:
    """No name of MAIN_PREDICTORS: each family's first predictor with predictions, a
    Bayesian (averaging) one before a single network."""
    ps = [_predicted("map", 0, LABELS), _predicted("my_swa", 1, LABELS)]
    ps += [_predicted("my_swag", 2, LABELS)]
    ps = [
        ps[0],
        dataclasses.replace(ps[1], method="swa"),
        dataclasses.replace(ps[2], method="swag"),
    ]
    assert [p.name for p in style.main_predictors(_inputs(ps))] == ["map", "my_swag"]


def test_intervals_are_95_percent_unless_params_say_otherwise() -> None:
    """ALGORITHMS §10: 95% intervals."""
    assert settings({}).level == 0.95


def test_the_calibrated_comparison_needs_the_same_labels() -> None:
    base = _predicted("map", 1, LABELS, temperature=1.5)
    other = _predicted("swag", 2, (LABELS + 1) % 3, temperature=0.8)
    assert calibrated_comparison(base, other, Settings(resamples=20)) is None


def test_the_samples_axis_is_the_number_of_samples_averaged() -> None:
    ps = [_result("map", by_samples=_samples(1, 0.9)), _result("swag", by_samples=_samples(3, 0.9))]
    fig = samples_layout(_inputs(ps))
    assert fig is not None
    assert {ax.get_xlabel() for ax in fig.axes} == {"samples in the average"}


def test_the_full_risk_coverage_panel_is_scaled_to_coverages_from_0_1() -> None:
    """Below 10% coverage one error among a few points is a large rate: left out of the
    y range, so the rest of the curve is readable."""
    ps = [_predicted(n, i, LABELS) for i, n in enumerate(("map", "swag"))]
    fig = selective.curves_figure(_inputs(ps))
    assert fig is not None
    tops = []
    for p in ps:
        coverage, risk = risk_coverage(
            torch.as_tensor(p.predictions.log_probs), torch.as_tensor(LABELS)
        )
        tops.append(100 * float(risk[coverage >= selective.CLIP].max()))
    assert fig.axes[0].get_ylim()[1] == pytest.approx(max(tops) * 1.05 + 1e-9)


def test_a_loss_axis_turns_logarithmic_beyond_a_factor_of_50() -> None:
    for span, scale in ((40.0, "linear"), (60.0, "log")):
        ax = Figure().subplots()
        ax.plot([1, 2], [1.0, span])
        training._log_if_wide(ax)
        assert ax.get_yscale() == scale, span


def test_sigma_ticks_are_linear_within_a_factor_3_and_1_2_5_up_to_4_decades() -> None:
    from matplotlib.ticker import LogLocator, MaxNLocator

    for span, kind in ((2.5, MaxNLocator), (10.0, LogLocator), (1e3, LogLocator)):
        ax = Figure().subplots()
        ax.set_yscale("log")
        variational._plain_log_ticks(ax.yaxis, span)
        assert isinstance(ax.yaxis.get_major_locator(), kind), span


def test_figure_pngs_carry_no_software_stamp() -> None:
    """The bytes must not change with the matplotlib version that drew them."""
    fig = Figure(figsize=(1, 1))
    fig.subplots().plot([0, 1], [0, 1])
    data = style.png(fig)
    assert data.startswith(b"\x89PNG") and b"Software" not in data and b"atplotlib" not in data
