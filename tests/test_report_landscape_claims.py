"""The landscape section's SWA and flat-seeking claims: planted lines and rays must come back
as the verdicts the papers' own pictures call for."""

from __future__ import annotations

import numpy as np
import pytest

from bayesavg.report.claims import Claim
from bayesavg.report.inputs import Landscape, LineData, PredictorResult, RayData, ReportInputs
from bayesavg.report.sections import landscape
from bayesavg.report.sections.landscape import measures

TS = [round(float(t), 2) for t in np.linspace(-1, 2, 31)]
STEP = 2.0  # the rays' distance grid: 0, 2, ..., 40


def _line(loss: list[float], nll: list[float]) -> LineData:
    rows = [
        {
            "t": t,
            "train_loss": lo,
            "weight_decay_term": 0.05,
            "train_error": lo / 5,
            "test_error": 0.03,
            "test_nll": n,
        }
        for t, lo, n in zip(TS, loss, nll, strict=True)
    ]
    return LineData("sgd", "swag", "weights", "snapshot_mean", rows)


def _asymmetric(t: float) -> float:
    """The SWA paper's picture: lowest at SGD (t = 0), a wall beyond it, a gentle slope
    towards SWA."""
    return 0.001 + (2.0 * t**2 if t < 0 else 0.01 * t**2)


def _falling_nll(t: float) -> float:
    return 0.18 - 0.045 * t


def _inputs(
    lines: dict[str, LineData] | None = None,
    rays: dict[str, RayData] | None = None,
    predictors: list[PredictorResult] | None = None,
) -> ReportInputs:
    land = Landscape(lines=lines or {}, rays=rays or {})
    return ReportInputs("t", predictors or [], {}, {}, [], landscape=land)


def _claim(inputs: ReportInputs, text: str) -> Claim:
    return next(c for c in landscape.claims(inputs) if text in c.statement)


def _edge(loss: list[float], nll: list[float]) -> Claim:
    return _claim(_inputs(lines={"sgd_swag": _line(loss, nll)}), "edge of the basin")


def test_the_papers_asymmetric_line_holds_although_sgd_has_the_lowest_train_loss() -> None:
    line = _line([_asymmetric(t) for t in TS], [_falling_nll(t) for t in TS])
    m = measures.line_minimum(line)
    assert m is not None and m.t_min == 0.0
    a = measures.line_asymmetry(line)
    assert a is not None and a.ts[-1] == 1.0 and len(a.ts) == 10
    assert a.ratio == pytest.approx(200.0)
    claim = _edge([_asymmetric(t) for t in TS], [_falling_nll(t) for t in TS])
    assert claim.holds is True
    assert "ratio 200" in claim.evidence and "10 of 10" in claim.evidence
    assert "0.18 at t = 0 → 0.135 at t = 1" in claim.evidence
    assert "Rule:" in claim.evidence


def test_a_symmetric_bowl_around_sgd_does_not_hold() -> None:
    claim = _edge([0.001 + 0.5 * t**2 for t in TS], [_falling_nll(t) for t in TS])
    assert claim.holds is False
    assert "ratio 1" in claim.evidence


def test_no_test_gain_at_swa_does_not_hold() -> None:
    claim = _edge([_asymmetric(t) for t in TS], [0.18 + 0.01 * t for t in TS])
    assert claim.holds is False
    assert "0.18 at t = 0 → 0.19 at t = 1" in claim.evidence


def test_a_loss_flat_beyond_sgd_does_not_hold() -> None:
    """No wall on the far side: SGD is at no edge, whatever happens towards SWA."""
    claim = _edge([0.001 + 0.01 * max(t, 0) ** 2 for t in TS], [_falling_nll(t) for t in TS])
    assert claim.holds is False
    assert "does not rise on the far side" in claim.evidence


def test_a_loss_still_falling_towards_swa_counts_as_the_gentle_side() -> None:
    loss = [0.05 + 2.0 * t**2 if t < 0 else 0.05 - 0.01 * t for t in TS]
    claim = _edge(loss, [_falling_nll(t) for t in TS])
    assert claim.holds is True
    assert "rises on the far side only" in claim.evidence


def test_nearest_symmetric_points_do_not_decide_alone() -> None:
    """One noisy pair at the smallest |t| (steeper towards SWA) leaves the verdict as the
    rest of the line sets it."""
    loss = [_asymmetric(t) for t in TS]
    loss[TS.index(0.1)] += 0.1
    a = measures.line_asymmetry(_line(loss, [_falling_nll(t) for t in TS]))
    assert a is not None and a.steeper_away == 9
    assert measures.edge_verdict(a) is True


def test_a_line_without_negative_t_is_unchecked() -> None:
    rows = [r for r in _line([_asymmetric(t) for t in TS], TS).rows if r["t"] >= 0]
    claim = _claim(_inputs(lines={"l": LineData("sgd", "swag", "w", "s", rows)}), "edge of")
    assert claim.holds is None and claim.number.startswith("n/a")


# ---------------------------------------------------------------- widths


def _ray(traj: str, widths: list[float | None], centre: str = "weights") -> RayData:
    rows = [
        {
            "direction": float(d),
            "distance": float(s),
            "train_loss": 0.001,
            "weight_decay_term": 0.05,
            "train_error": 0.0,
            "test_error": 0.03,
            "test_nll": 0.1,
        }
        for d in range(len(widths))
        for s in np.arange(0.0, 40.0 + STEP / 2, STEP)
    ]
    return RayData(traj, centre, rows, widths, 0.1, False)


def _predictor(
    name: str, method: str, traj: str, trace: float, sam: float, trace_se: float | None = None
) -> PredictorResult:
    metrics = {"hessian_trace": trace, "sharpness": sam, "nll": 0.1}
    if trace_se is not None:
        metrics["hessian_trace_se"] = trace_se
    return PredictorResult(name, method, traj, 1.0, metrics, [], [])


def _width_claim(
    narrow: list[float | None],
    wide: list[float | None],
    predictors: list[PredictorResult] | None = None,
) -> Claim:
    rays = {"sgd": _ray("sgd", narrow), "swag": _ray("swag", wide, "snapshot_mean")}
    return _claim(_inputs(rays=rays, predictors=predictors), "swag centre lies in a wider")


def test_the_tolerance_is_one_step_of_the_distance_grid() -> None:
    assert measures.ray_step(_ray("sgd", [1.0])) == STEP


def test_sub_step_differences_are_ties() -> None:
    """21.8975 vs 21.8916: the same width at a resolution of one grid step."""
    narrow = [21.8916, 10.0, 10.0, 10.0, 10.0, 10.0]
    wide = [21.8975, 11.9, 10.5, 8.5, 10.0, 11.99]
    c = measures.compare_widths(_ray("sgd", narrow), _ray("swag", wide))
    assert c is not None and c.tolerance == STEP
    assert (c.wider, c.narrower, c.ties) == (0, 0, 6)
    assert c.verdict is None
    exact = measures.compare_widths(_ray("sgd", narrow), _ray("swag", wide), tolerance=0.0)
    assert exact is not None and (exact.wider, exact.narrower) == (4, 1)


def test_three_of_three_wider_is_undecided() -> None:
    claim = _width_claim([10.0, 10.0, 10.0], [20.0, 20.0, 20.0])
    assert claim.holds is None
    assert claim.number.startswith("undecided (3 directions)")
    assert "p = 0.125" in claim.evidence


@pytest.mark.parametrize(("k", "p"), [(5, 1 / 32), (4, 1 / 16), (3, 1 / 8), (0, 1.0)])
def test_sign_test_of_all_one_way(k: int, p: float) -> None:
    assert measures.sign_test_p(k, k) == pytest.approx(p)


def test_five_directions_all_one_way_decide() -> None:
    wider = _width_claim([10.0] * 5, [14.0] * 5)
    assert wider.holds is True
    assert "wider in 5 and narrower in 0 of 5" in wider.evidence
    narrower = _width_claim([14.0] * 5, [10.0] * 5)
    assert narrower.holds is False


def test_a_width_beyond_the_grid_counts_as_its_end() -> None:
    c = measures.compare_widths(_ray("sgd", [39.0, None]), _ray("swag", [None, None]))
    assert c is not None and (c.wider, c.ties, c.censored) == (0, 2, 3)


def test_sharpness_at_the_ray_centres_only() -> None:
    """swa measures at the snapshot mean, the swag ray's centre; map on the same trajectory
    measures at the final weights, which the ray does not start from."""
    predictors = [
        _predictor("map", "map", "swag", 1.0, 0.1),
        _predictor("swa", "swa", "swag", 7.0, 0.7),
    ]
    found = measures.centre_sharpness(predictors, _ray("swag", [1.0], "snapshot_mean"))
    assert found == {"hessian_trace": 7.0, "sharpness": 0.7}
    assert measures.centre_sharpness(predictors, _ray("fswag", [1.0], "snapshot_mean")) == {}


def test_sharpness_disagreeing_with_the_rays_gives_mixed() -> None:
    sharper = [
        _predictor("map", "map", "sgd", 2.0, 0.001),
        _predictor("swa", "swa", "swag", 5.0, 0.0005),
    ]
    claim = _width_claim([10.0] * 5, [14.0] * 5, sharper)
    assert claim.holds is None
    assert claim.number.startswith("mixed") and "tr(H) sharper" in claim.number
    assert "SAM sharpness" not in claim.number
    assert "tr(H) 5 (swag) vs 2 (sgd): swag sharper" in claim.evidence
    assert "Mixed: the rays say wider, but by tr(H) swag is sharper" in claim.evidence
    assert "SAM sharpness 0.0005 (swag) vs 0.001 (sgd): swag flatter" in claim.evidence


def test_sharpness_agreeing_with_the_rays_keeps_the_verdict() -> None:
    flatter = [
        _predictor("map", "map", "sgd", 5.0, 0.002),
        _predictor("swa", "swa", "swag", 2.0, 0.001),
    ]
    claim = _width_claim([10.0] * 5, [14.0] * 5, flatter)
    assert claim.holds is True
    assert not claim.number.startswith("mixed")


def test_undecided_rays_name_the_measures_against_their_lean() -> None:
    sharper = [
        _predictor("map", "map", "sgd", 2.0, 0.001),
        _predictor("swa", "swa", "swag", 5.0, 0.002),
    ]
    claim = _width_claim([10.0] * 3, [14.0] * 3, sharper)
    assert claim.holds is None
    assert claim.number.endswith("tr(H) and SAM sharpness sharper")
    assert "The rays lean wider; by tr(H) and SAM sharpness swag is sharper" in claim.evidence


def test_measures_without_both_centres_change_nothing() -> None:
    only_one = [_predictor("map", "map", "sgd", 2.0, 0.001)]
    claim = _width_claim([10.0] * 5, [14.0] * 5, only_one)
    assert claim.holds is True
    assert "No tr(H) or SAM sharpness" in claim.evidence


@pytest.mark.parametrize(("se", "mixed"), [(0.5, True), (1.2, False)])
def test_a_trace_difference_within_its_probe_noise_does_not_overrule_the_rays(
    se: float, mixed: bool
) -> None:
    """tr(H) 5 vs 2 with standard errors se each: the noise is 2 * sqrt(2) * se, so
    0.5 (1.41) leaves a difference of 3 standing and 1.2 (3.39) swallows it."""
    sharper = [
        _predictor("map", "map", "sgd", 2.0, 0.002, trace_se=se),
        _predictor("swa", "swa", "swag", 5.0, 0.001, trace_se=se),
    ]
    claim = _width_claim([10.0] * 5, [14.0] * 5, sharper)
    assert f"tr(H) 5 ± {se:.2g} (swag) vs 2 ± {se:.2g} (sgd)" in claim.evidence
    assert "beyond 2 standard errors of its probes" in claim.evidence
    if mixed:
        assert claim.holds is None and "tr(H) sharper" in claim.number
    else:
        assert (
            claim.holds is True and "within probe noise (+3, inside ±3.4: 2 SE)" in claim.evidence
        )


def test_a_measure_s_standard_error_comes_from_the_centre_s_predictor() -> None:
    predictors = [_predictor("swa", "swa", "swag", 7.0, 0.7, trace_se=0.25)]
    found = measures.centre_sharpness(predictors, _ray("swag", [1.0], "snapshot_mean"))
    assert found == {"hessian_trace": 7.0, "hessian_trace_se": 0.25, "sharpness": 0.7}


def test_the_geometry_table_gives_tr_h_with_its_standard_error() -> None:
    from bayesavg.report.sections.metrics import geometry_table

    table = geometry_table(
        [
            _predictor("swa", "swa", "swag", 1234.5, 0.7, trace_se=56.0),
            _predictor("map", "map", "sgd", 2.0, 0.001),  # probes: 1, no error
            PredictorResult("none", "map", "sgd", 1.0, {"nll": 0.1}, [], []),
        ]
    )
    assert table is not None
    rows = [[c.text for c in row] for row in table.rows]
    assert rows == [["swa", "0.7000", "1234 ± 56"], ["map", "0.0010", "2"]]
