"""The report's analyses: planted numbers must come back as the claims' verdicts."""

from __future__ import annotations

import dataclasses
import io
import itertools
import math

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from bayesavg.report import sigma_curves, stats
from bayesavg.report.blocks import Block, FigureBlock
from bayesavg.report.claims import Claim
from bayesavg.report.inputs import (
    Landscape,
    LineData,
    Predictions,
    PredictorResult,
    RayData,
    ReportInputs,
    SwagDirections,
    SweepPoint,
    is_bayesian,
)
from bayesavg.report.sections import landscape, sharpness, shift
from bayesavg.report.sections import ood as ood_section
from bayesavg.report.sections.landscape import figures as landscape_figures
from bayesavg.report.sections.landscape import measures as landscape_measures
from bayesavg.report.sections.shift import figures as shift_figures
from bayesavg.report.sections.shift import measures as shift_measures
from bayesavg.report.uncertainty import Uncertainty, settings

ANGLES = list(range(0, 181, 15))
CORRUPTIONS = ("shot_noise", "translate", "brightness")
N, C = 300, 10
# (name, method, trajectory)
PREDICTORS = (
    ("map", "map", "sgd"),
    ("swa", "swa", "swag"),
    ("swag", "swag", "swag"),
    ("fswag", "swag", "fswag"),
    ("ensemble", "ensemble", "ensemble"),
)
PARAMS = {
    "finetune": {
        "sgd": {},
        "swag": {},
        "fswag": {"sam_rho": 0.05},
        "ensemble": {"kind": "ensemble"},
    },
    "report": {"bootstrap": {"resamples": 300, "seed": 0}},
}


def _log_probs(p_true: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Log-probabilities with p_true on the label and the rest spread evenly."""
    probs = np.repeat(((1 - p_true) / (C - 1))[:, None], C, axis=1)
    probs[np.arange(len(y)), y] = p_true
    return np.log(probs)


def _p_true(rng: np.random.Generator, angle: float, boost: float) -> np.ndarray:
    """Baseline confidence on the label falls with the angle; ``boost`` lifts it (in logit)."""
    logit = 3.0 - angle / 30 + rng.normal(0, 1.0, N) + boost
    return 1 / (1 + np.exp(-logit))


def _predictions(seed: int, boost_per_degree: float, tiny: float = 0.0) -> Predictions:
    """Seeded per-point predictions; every predictor shares the baseline's draws (seed 0)
    so that only ``boost_per_degree`` sets the paired difference. ``tiny``: the baseline's
    confidences shuffled over the points (the same mean NLL, large per-point differences)
    and lifted by ``tiny`` in logit: a real but tiny gap."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, C, N)
    shift = {}
    for a in ANGLES:
        p = _p_true(rng, a, boost_per_degree * a)
        if tiny:
            p = np.random.default_rng(seed + a).permutation(p)
            p = 1 / (1 + np.exp(-(np.log(p / (1 - p)) + tiny)))
        shift[f"rotate_{a}"] = _log_probs(p, y)
    ood_rng = np.random.default_rng(seed)
    spread = 1.0 + 2.0 * abs(boost_per_degree) * 100
    scores = {
        "test": {"entropy": ood_rng.gamma(1.0, 0.1, 400)},
        "animal_mnist": {"entropy": ood_rng.gamma(2.0, 0.3 * spread, 500)},
    }
    return Predictions(y, shift["rotate_0"], y, shift, scores)


def _metrics(i: int, predictions: Predictions, auroc: float) -> dict[str, object]:
    shift = {}
    for name, lp in predictions.shift_log_probs.items():
        nll = float(-lp[np.arange(N), predictions.shift_y].mean())
        acc = float((lp.argmax(1) == predictions.shift_y).mean())
        shift[name] = {"accuracy": acc, "nll": nll, "ece": 0.01 * i + nll / 10, "brier": nll / 2}
        shift[name]["entropy"] = nll / 3
    for j, name in enumerate(CORRUPTIONS):
        shift[name] = {k: 0.1 * (j + 1) + 0.01 * i for k in shift_measures.SHIFT_METRICS}
    scores = {"auroc": auroc, "aupr_in": auroc - 0.05, "aupr_out": auroc - 0.02, "fpr95": 1 - auroc}
    ood = {"animal_mnist": {s: dict(scores) for s, _ in ood_section.OOD_SCORES}}
    return {
        "accuracy": 0.98 - 0.001 * i,
        "nll": 0.05 + 0.01 * i,
        "ece": 0.01 + 0.002 * i,
        "brier": 0.03,
        "sharpness": 0.1 * (i + 1),
        "hessian_trace": 10.0 * (i + 1) ** 2,
        "shift": shift,
        "ood": ood,
    }


def _predictors(boost: float = 0.01, tiny: float = 0.0) -> list[PredictorResult]:
    out = []
    for i, (name, method, traj) in enumerate(PREDICTORS):
        bayes = method not in ("map", "swa")
        pred = _predictions(i, boost if bayes else 0.0, tiny if bayes else 0.0)
        auroc = 0.9 if bayes else 0.8
        out.append(PredictorResult(name, method, traj, 0.5, _metrics(i, pred, auroc), [], [], pred))
    return out


def _quadratic_line(t_min: float) -> LineData:
    rows = []
    for t in np.linspace(-1, 2, 13):
        loss = 0.05 + 0.2 * (t - t_min) ** 2
        rows.append(
            {
                "t": float(t),
                "train_loss": loss,
                "weight_decay_term": 0.01 + 0.001 * t**2,
                "train_error": loss / 5,
                "test_error": 0.01 + loss / 4,
                "test_nll": loss * 1.2,
            }
        )
    return LineData("sgd", "swag", "weights", "snapshot_mean", rows)


def _ray(traj: str, widths: list[float | None]) -> RayData:
    rows = []
    for d, w in enumerate(widths):
        scale = w if w is not None else 50.0
        for s in np.linspace(0, 10, 11):
            loss = 0.05 * (1 + (s / scale) ** 2)
            rows.append(
                {
                    "direction": d,
                    "distance": float(s),
                    "train_loss": loss,
                    "weight_decay_term": 0.01,
                    "train_error": loss / 5,
                    "test_error": 0.01 + loss / 4,
                    "test_nll": loss,
                }
            )
    return RayData(traj, "weights", rows, widths, 0.05, True)


def _sigma_rows(flat_to: float, drop: float = 0.2) -> list[dict[str, float]]:
    rows = []
    for m in (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0):
        for draw in range(3):
            acc = (
                0.98
                - 0.002 * draw
                + (0.0 if m <= flat_to else -drop * math.log10(m / flat_to) - 0.02)
            )
            rows.append(
                {"multiple": m, "draw": draw, "accuracy": acc, "nll": 0.1, "sigma_norm": 3.0}
            )
    return rows


def _swag(traj: str, flat_to: float) -> SwagDirections:
    directions = []
    for d in range(3):
        for off in np.linspace(-3, 3, 7):
            loss = 0.05 * (1 + (off / (d + 2)) ** 2)
            directions.append(
                {
                    "direction": d,
                    "sigma": 0.1 / (d + 1),
                    "offset": float(off),
                    "distance": float(off) * 0.1,
                    "train_loss": loss,
                    "weight_decay_term": 0.01,
                    "train_error": loss / 5,
                    "test_error": 0.01 + loss / 4,
                    "test_nll": loss,
                }
            )
    return SwagDirections(traj, directions, _sigma_rows(flat_to))


def _landscape(t_min: float = 0.8, flat_to: float = 10.0) -> Landscape:
    return Landscape(
        lines={"sgd_swag": _quadratic_line(t_min)},
        rays={
            "sgd": _ray("sgd", [1.0, 1.5, 2.0, 1.0]),
            "swag": _ray("swag", [2.0, 2.5, None, 3.0]),
            "fswag": _ray("fswag", [3.0, 2.0, None, 4.0]),
        },
        swag={"swag": _swag("swag", flat_to), "fswag": _swag("fswag", 100.0)},
    )


def _sweep() -> list[SweepPoint]:
    return [SweepPoint(w, 10, 5, 0.95, 4, {}, [], _sigma_rows(5.0 * w)) for w in (1, 10)]


def _inputs(**changes: object) -> ReportInputs:
    base = ReportInputs(
        "t",
        _predictors(),
        {},
        PARAMS,
        {},
        baseline="map",
        pairs=[("swag", "fswag")],
        dswag_sweep=_sweep(),
        landscape=_landscape(),
    )
    return dataclasses.replace(base, **changes)


ANALYSES = (shift, ood_section, landscape, sharpness)


def _unc(inputs: ReportInputs) -> Uncertainty:
    """No intervals: the analysis sections bootstrap their own numbers, so the report's
    intervals (slow to compute) are not needed."""
    return Uncertainty(settings(inputs.params))


def analysis_claims(inputs: ReportInputs) -> list[Claim]:
    """The analysis sections' claims, in report order, without drawing their figures."""
    return [c for m in ANALYSES for c in m.claims(inputs)]


def analysis_blocks(inputs: ReportInputs) -> list[Block]:
    """The analysis sections' blocks, in report order."""
    unc = _unc(inputs)
    return [b for m in ANALYSES for b in m.build(inputs, unc).blocks]


def analysis_pngs(inputs: ReportInputs) -> dict[str, bytes]:
    """The PNG of every figure the analysis sections show, by name."""
    return {b.name: b.png for b in analysis_blocks(inputs) if isinstance(b, FigureBlock)}


def analysis_figures(inputs: ReportInputs) -> dict[str, Figure]:
    """Every analysis figure with data, before encoding."""
    ood_set = ood_section._first_ood_set(inputs)
    built = {
        "analysis_shift": shift_figures.shift_figure(inputs),
        "analysis_shift_gap": shift_figures.shift_gap_figure(inputs, shift._shift_gaps(inputs)),
        "analysis_ood": ood_section.ood_histogram_figure(inputs, ood_set) if ood_set else None,
        "analysis_line": landscape_figures.line_figure(inputs),
        "analysis_rays": landscape_figures.rays_figure(inputs),
        "analysis_swag_directions": landscape_figures.swag_directions_figure(inputs),
        "analysis_sigma_distance": landscape_figures.sigma_distance_figure(inputs),
        "analysis_sharpness": sharpness.sharpness_figure(inputs),
    }
    return {name: f for name, f in built.items() if f is not None}


@pytest.fixture(scope="module")
def inputs() -> ReportInputs:
    return _inputs()


@pytest.fixture(scope="module")
def pngs(inputs: ReportInputs) -> dict[str, bytes]:
    return analysis_pngs(inputs)


def _claim(found: list[Claim], text: str) -> Claim:
    return next(c for c in found if text in c.statement)


# ---------------------------------------------------------------- landscape


@pytest.mark.parametrize(
    ("t_min", "holds"),
    [(0.75, True), (1.0, True), (0.0, False), (-0.25, False), (2.0, True), (3.0, True)],
)
def test_line_claim_finds_the_planted_minimum(t_min: float, holds: bool | None) -> None:
    """The edge picture is the asymmetry about SGD (steep behind it, gentle towards SWA)
    with SWA better on test: a minimum towards SWA or beyond it has it, a bowl centred
    at SGD or behind it does not."""
    line = _quadratic_line(t_min)
    found = min(t_min, 2.0)
    assert landscape_measures.line_minimum(line).t_min == pytest.approx(found)
    claim = _claim(analysis_claims(_inputs(landscape=_landscape(t_min=t_min))), "edge of the basin")
    assert claim.holds is holds
    assert f"t = {found:g}" in claim.evidence


def test_widths_claim_compares_the_planted_widths() -> None:
    lands = _landscape()
    """4 of 4 directions one way is a sign test's p = 1/16: it leans, it does not decide
    (5 of 5 does: tests/test_report_landscape_claims.py)."""
    wide = _claim(analysis_claims(_inputs(landscape=lands)), "swag centre lies in a wider")
    assert wide.holds is None
    assert "wider in 4 and narrower in 0 of 4" in wide.evidence
    swapped = dataclasses.replace(
        lands, rays={"sgd": lands.rays["swag"], "swag": lands.rays["sgd"]}
    )
    narrow = _claim(analysis_claims(_inputs(landscape=swapped)), "swag centre lies in a wider")
    assert narrow.holds is None
    assert "wider in 0 and narrower in 4 of 4" in narrow.evidence


def test_widths_beyond_the_grid_count_as_its_end() -> None:
    ray = _ray("swag", [2.0, None])
    assert landscape_measures.ray_widths(ray) == [2.0, 10.0]


def test_mixed_directions_leave_the_width_claim_undecided() -> None:
    c = landscape_measures.compare_widths(
        _ray("sgd", [1.0, 1.0, 5.0]), _ray("swag", [3.0, 0.5, 4.0]), tolerance=0.0
    )
    assert c is not None and c.mean_wide > c.mean_narrow
    assert (c.wider, c.narrower) == (1, 2)
    assert c.verdict is None


@pytest.mark.parametrize(("flat_to", "holds"), [(2.0, False), (10.0, False), (100.0, True)])
def test_sigma_distance_returns_the_planted_breakpoint(flat_to: float, holds: bool) -> None:
    curve = sigma_curves.sigma_curve_of(_sigma_rows(flat_to))
    assert curve is not None and sigma_curves.flat_range(curve) == flat_to
    claim = _claim(analysis_claims(_inputs(landscape=_landscape(flat_to=flat_to))), "(swag)")
    assert claim.holds is holds
    assert f"up to m = {flat_to:g}" in claim.evidence


def test_sigma_claim_is_undecided_when_the_grid_stops_short() -> None:
    rows = [r for r in _sigma_rows(100.0) if r["multiple"] <= 20]
    curve = sigma_curves.sigma_curve_of(rows)
    assert sigma_curves.flat_range(curve) == 20.0
    assert landscape_measures.flat_verdict(curve, 20.0) is None


def test_missing_landscape_gives_no_crash_and_undecided_claims() -> None:
    bare = _inputs(landscape=None, dswag_sweep=[])
    found = analysis_claims(bare)
    for text in ("edge of the basin", "swag centre lies in a wider", "flat out to"):
        claim = _claim(found, text)
        assert claim.holds is None and "no landscape" in claim.evidence
    drawn = analysis_pngs(bare)
    assert not {"analysis_line", "analysis_rays", "analysis_sigma_distance"} & set(drawn)
    blocks = analysis_blocks(bare)
    assert any("No landscape figures" in getattr(b, "text", "") for b in blocks)


def test_nothing_at_all_still_renders_sections() -> None:
    bare = ReportInputs("t", [], {}, {}, {})
    assert analysis_pngs(bare) == {}
    assert all(c.holds is None for c in analysis_claims(bare))
    assert analysis_blocks(bare)


# ---------------------------------------------------------------- sharpness


def _brute_spearman(x: list[float], y: list[float]) -> float:
    """Average ranks by counting, then Pearson's formula written out."""

    def rank(v: list[float]) -> list[float]:
        return [sum(w < a for w in v) + (sum(w == a for w in v) + 1) / 2 for a in v]

    rx, ry = rank(x), rank(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy)


def test_spearman_matches_brute_force_with_ties() -> None:
    x = [0.3, 0.1, 0.3, 0.7, 0.2, 0.7, 0.9]
    y = [2.0, 1.0, 1.5, 1.5, 3.0, 4.0, 0.5]
    assert stats.spearman(x, y) == pytest.approx(_brute_spearman(x, y), abs=1e-12)
    assert list(stats.ranks(np.array(x))) == [3.5, 1.0, 3.5, 5.5, 2.0, 5.5, 7.0]


def test_exact_permutation_p_counts_orderings() -> None:
    x = [1.0, 2.0, 3.0, 4.0]
    # Only the identity ordering reaches rho = 1: p = 1 / 4!.
    assert stats.clustered_permutation_p(x, x) == pytest.approx(1 / math.factorial(4))
    rhos = [stats.spearman(x, list(p)) for p in itertools.permutations(x)]
    assert stats.clustered_permutation_p(x, [4.0, 3.0, 2.0, 1.0]) == 1.0
    assert min(rhos) == -1.0


def _with_sharpness(inputs: ReportInputs, sign: float) -> ReportInputs:
    ps = []
    for i, p in enumerate(inputs.predictors):
        m = {**p.metrics, "sharpness": 0.1 + 0.05 * i, "hessian_trace": 5.0 + i}
        m["ece"] = 0.05 + sign * 0.005 * i
        m["nll"] = 0.2 + sign * 0.01 * i
        ps.append(dataclasses.replace(p, metrics=m))
    return dataclasses.replace(inputs, predictors=ps)


@pytest.mark.parametrize(("sign", "holds"), [(1.0, True), (-1.0, False)])
def test_flat_calibration_claim_follows_the_planted_sign(
    inputs: ReportInputs, sign: float, holds: bool
) -> None:
    planted = _with_sharpness(inputs, sign)
    for x in ("sharpness", "hessian_trace"):
        found = sharpness.sharpness_correlations(planted, x)
        assert [c.rho for c in found] == [pytest.approx(sign), pytest.approx(sign)]
        assert all(c.n == c.networks == len(PREDICTORS) for c in found)
    claim = _claim(analysis_claims(planted), "lower SAM sharpness")
    assert claim.holds is holds
    assert f"n = {len(PREDICTORS)}" in claim.evidence


# ---------------------------------------------------------------- shift and OOD


def _with_control(inputs: ReportInputs, boost: float) -> ReportInputs:
    """The inputs and map_ts: the baseline's method at a fitted temperature, a single
    network whose confidence on the label rises by ``boost`` (logit) per degree."""
    pred = _predictions(len(PREDICTORS), boost)
    metrics = {**_metrics(len(PREDICTORS), pred, 0.8), "temperature": 1.5}
    control = PredictorResult("map_ts", "map", "sgd", 0.0, metrics, [], [], pred)
    return dataclasses.replace(inputs, predictors=[*inputs.predictors, control])


def test_a_tiny_shift_gap_is_within_noise(inputs: ReportInputs) -> None:
    tiny = _inputs(predictors=_predictors(boost=0.0, tiny=1e-3))
    gaps = [g for g in shift_measures.shift_gaps(tiny, tiny.predictors[0]) if g.bayesian]
    assert [g.predictor for g in gaps] == ["swag", "fswag", "ensemble"]
    for g in gaps:
        assert all(iv is not None and iv.verdict() == "within noise" for iv in g.intervals)
        assert g.growth is not None and g.growth.low < 0 < g.growth.high
        assert shift_measures.growth_verdict(g) is None
    claim = _claim(analysis_claims(tiny), "helps most under shift")
    assert claim.holds is None


def test_a_growing_shift_gap_holds_beyond_a_control_that_does_not_grow(
    inputs: ReportInputs,
) -> None:
    gaps = [g for g in shift_measures.shift_gaps(inputs, inputs.predictors[0]) if g.bayesian]
    for g in gaps:
        assert g.gap[-1] > g.gap[0]
        assert g.growth is not None and g.growth.low > 0
        assert g.intervals[-1] is not None and g.intervals[-1].verdict() == "better"
    flat = _with_control(inputs, 0.0)
    assert _claim(analysis_claims(flat), "helps most under shift").holds is True
    shrinking = _with_control(_inputs(predictors=_predictors(boost=-0.01)), 0.0)
    assert _claim(analysis_claims(shrinking), "helps most under shift").holds is False


def test_shift_gaps_are_bootstrapped_once_per_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawn, claimed and tabled from one computation, with the numbers of a fresh one."""
    fresh, original, calls = _with_control(_inputs(), 0.0), shift_measures.shift_gaps, []

    def counted(inputs: ReportInputs, base: PredictorResult) -> list[shift_measures.ShiftGap]:
        calls.append(inputs)
        return original(inputs, base)

    monkeypatch.setattr(shift, "shift_gaps", counted)
    shift.build(fresh, _unc(fresh))  # drawn (the other sections' figures need no gaps)
    claim = _claim(analysis_claims(fresh), "helps most under shift")
    blocks = shift.build(fresh, _unc(fresh)).blocks
    assert calls == [fresh]
    first = next(g for g in original(fresh, fresh.predictors[0]) if g.bayesian)
    assert claim.holds is True and f"{shift_measures.large_gap(first):+.4f}" in str(blocks)
    tables = [b.table for b in blocks if getattr(b, "kind", "") == "table"]
    assert any("Growth [95%]" in t.header for t in tables)


def test_shift_claim_without_predictions_has_no_interval(inputs: ReportInputs) -> None:
    found = _with_control(inputs, 0.0).predictors
    bare = [dataclasses.replace(p, predictions=None) for p in found]
    claim = _claim(analysis_claims(_inputs(predictors=bare)), "helps most under shift")
    assert claim.holds is None and "no interval" in claim.evidence


def test_corruption_summary_means_and_worst(inputs: ReportInputs) -> None:
    s = shift_measures.corruption_summary(inputs.predictors[1])
    assert s is not None and s["worst"] == "brightness"
    assert s["means"]["nll"] == pytest.approx(0.2 + 0.01)


def test_ood_claim_compares_entropy_auroc(inputs: ReportInputs) -> None:
    claim = _claim(analysis_claims(inputs), "detect OOD")
    assert claim.holds is True and "3 are higher" in claim.evidence
    flipped = []
    for p in inputs.predictors:
        auroc = 0.7 if is_bayesian(p) else 0.9
        ood = {"animal_mnist": {"entropy": {"auroc": auroc}}}
        pred = p.predictions
        if is_bayesian(p) and pred is not None:  # the paired verdicts rest on per-point scores
            shrunk = {"entropy": pred.ood_scores["animal_mnist"]["entropy"] * 0.1}
            pred = dataclasses.replace(pred, ood_scores={**pred.ood_scores, "animal_mnist": shrunk})
        flipped.append(dataclasses.replace(p, metrics={**p.metrics, "ood": ood}, predictions=pred))
    assert _claim(analysis_claims(_inputs(predictors=flipped)), "detect OOD").holds is False


def test_single_networks_have_no_mutual_information_row(
    inputs: ReportInputs, pngs: dict[str, bytes]
) -> None:
    blocks = analysis_blocks(inputs)
    tables = [b.table for b in blocks if getattr(b, "kind", "") == "table"]
    mi = next(t for t in tables if any("MI = 0" in r[1].text for r in t.rows))
    assert {r[0].text for r in mi.rows if "MI = 0" in r[1].text} == {"map", "swa"}
    pred = next(p.predictions for p in inputs.predictors if p.predictions is not None)
    n_test, n_ood = (len(pred.ood_scores[k]["entropy"]) for k in ("test", "animal_mnist"))
    heads = [b.text for b in blocks if getattr(b, "level", 0) == 3 and "score" in b.text]
    assert heads and all(f"({n_test} test, {n_ood} OOD images)" in h for h in heads)


# ---------------------------------------------------------------- figures


EXPECTED = {
    "analysis_shift",
    "analysis_shift_gap",
    "analysis_ood",
    "analysis_line",
    "analysis_rays",
    "analysis_swag_directions",
    "analysis_sigma_distance",
    "analysis_sharpness",
}


def test_every_figure_is_a_valid_png(pngs: dict[str, bytes]) -> None:
    assert set(pngs) == EXPECTED
    for png in pngs.values():
        with Image.open(io.BytesIO(png)) as image:
            image.verify()
            assert image.format == "PNG"


def test_legends_lie_inside_the_canvas(inputs: ReportInputs) -> None:
    for name, fig in analysis_figures(inputs).items():
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
        bbox = fig.bbox
        for legend in legends:
            box = legend.get_window_extent(renderer)
            inside = (
                box.x0 >= bbox.x0 - 1
                and box.y0 >= bbox.y0 - 1
                and box.x1 <= bbox.x1 + 1
                and box.y1 <= bbox.y1 + 1
            )
            assert inside, f"{name}: legend {box} outside {bbox}"


def test_sections_embed_every_drawn_figure(inputs: ReportInputs, pngs: dict[str, bytes]) -> None:
    blocks = analysis_blocks(inputs)
    shown = {b.name for b in blocks if getattr(b, "kind", "") == "figure"}
    assert shown == set(pngs)


def test_drawing_twice_is_byte_identical(inputs: ReportInputs, pngs: dict[str, bytes]) -> None:
    assert analysis_pngs(inputs) == pngs


@pytest.mark.parametrize("n", [3, 6, 8, 9, 24])
def test_clustered_permutation_p_is_the_one_permutation_at_a_time_count(n: int) -> None:
    """The vectorised test counts exactly what a loop counts that gives each unit (points
    of one x) another unit's value and recomputes Spearman's rho: every permutation of
    the units up to 8 of them, else the seeded draws; ties in y too."""
    import itertools

    gen = np.random.default_rng(n)
    units = gen.integers(0, max(2, n - 2), n)
    values = gen.normal(size=int(units.max()) + 1)
    x = [float(values[u]) for u in units]
    y = (gen.normal(size=n) + np.asarray(x)).round(1).tolist()
    distinct, unit = np.unique(np.asarray(x), return_inverse=True)
    k = len(distinct)
    observed = stats.spearman(x, y)
    if k <= stats.EXACT_PERMUTATIONS_MAX:
        orders = [np.asarray(p) for p in itertools.permutations(range(k))]
    else:
        rng = np.random.default_rng(0)
        orders = [np.arange(k)] + [rng.permutation(k) for _ in range(stats.RANDOM_PERMUTATIONS)]
    if n == 24:
        orders = orders[:2001]  # a loop over all 20,001 is slow; the first 2,001 of them

    def count(rows: list[np.ndarray]) -> float:
        rhos = [stats.spearman(distinct[order][unit].tolist(), y) for order in rows]
        return float(np.mean([r >= observed - 1e-12 for r in rhos]))

    if n == 24:
        saved = stats.RANDOM_PERMUTATIONS
        stats.RANDOM_PERMUTATIONS = 2000
        try:
            assert stats.clustered_permutation_p(x, y) == count(orders)
        finally:
            stats.RANDOM_PERMUTATIONS = saved
    else:
        assert stats.clustered_permutation_p(x, y) == count(orders)


def test_predictors_of_one_network_move_together() -> None:
    """Two networks, each measured by three predictors whose metric rises with the
    network's sharpness: rho is 0.87 over six points, but only two orderings of two
    networks exist, so p is 1/2, not the 1/20 of six independent points."""
    x = [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    y = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert stats.spearman(x, y) == pytest.approx(0.8783100656536799)
    assert stats.clustered_permutation_p(x, y) == 0.5
    # three networks (one measured twice): 3! orderings, only the observed one as high
    assert stats.clustered_permutation_p([1.0, 1.0, 2.0, 3.0], y[:4]) == pytest.approx(1 / 6)


def test_a_sections_claims_are_those_its_build_gives(inputs: ReportInputs) -> None:
    """``claims`` (for the headline, without figures) and ``build`` agree."""
    for section in ANALYSES:
        assert section.claims(inputs) == section.build(inputs, _unc(inputs)).claims


def test_the_laplace_probit_is_bayesian_without_samples_for_mi() -> None:
    """A closed-form posterior predictive counts among the Bayesian predictors (it is no
    single network) but has no samples: its MI row says why, not 'single network'."""
    from bayesavg.report.inputs import is_closed_form
    from bayesavg.report.sections.ood import _ood_table

    def result(name: str, method: str) -> PredictorResult:
        ood = {"animal_mnist": {"mutual_info": {"auroc": 0.5}, "entropy": {"auroc": 0.9}}}
        return PredictorResult(name, method, "t", 0.0, {"ood": ood}, [], [])

    found = [result("map", "map"), result("laplace", "laplace"), result("swag", "swag")]
    assert [is_bayesian(p) for p in found] == [False, True, True]
    assert [is_closed_form(p) for p in found] == [False, True, False]
    inputs = dataclasses.replace(_inputs(), predictors=found)
    table = _ood_table(inputs, "animal_mnist", "mutual_info")
    assert table is not None
    rows = {row[0].text: row[1].text for row in table.rows}
    assert rows["map"] == "- (single network, so MI = 0)"
    assert rows["laplace"] == "- (closed-form predictive: no samples, so MI = 0)"
