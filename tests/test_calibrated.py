"""Calibration done right (issue 29 §2, ALGORITHMS §10-11): metrics at each predictor's own
temperature, the deep-ensemble equivalent, and ECE's bias-corrected interval."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from bayesavg.evaluation.calibrated import (
    calibrated_metrics,
    calibrated_nll,
    dee_text,
    deep_ensemble_equivalent,
)
from bayesavg.evaluation.evaluate import evaluate
from bayesavg.evaluation.metrics import adaptive_ece, brier, classwise_ece, ece, nll
from bayesavg.predictors.calibration import fit_temperature
from bayesavg.report.intervals import _percentiles, _resampled, bootstrap, resample_counts

CPU = torch.device("cpu")


def _overconfident(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 5, generator=gen, dtype=torch.float64) * 3
    y = torch.distributions.Categorical(logits=logits / 2).sample()  # truth flatter: T > 1
    return torch.log_softmax(logits, 1), y


def test_calibrated_metrics_are_the_metrics_at_the_validation_temperature() -> None:
    val_lp, val_y = _overconfident(400, 0)
    test_lp, test_y = _overconfident(300, 1)
    found = calibrated_metrics(val_lp, val_y, test_lp, test_y, 20)
    t = fit_temperature(val_lp, val_y)
    assert found["temperature"] == t and t > 1.2
    tempered = torch.log_softmax(test_lp / t, 1)  # brute force: divide, renormalise
    assert found["nll"] == pytest.approx(float(nll(tempered, test_y)), abs=1e-12)
    assert found["ece"] == pytest.approx(float(ece(tempered, test_y, 20)), abs=1e-12)
    assert found["brier"] == pytest.approx(float(brier(tempered, test_y)), abs=1e-12)
    assert found["ece_adaptive"] == pytest.approx(float(adaptive_ece(tempered, test_y)))
    assert found["ece_classwise"] == pytest.approx(float(classwise_ece(tempered, test_y)))
    assert found["nll"] < float(nll(test_lp, test_y))  # tempering fixed overconfidence
    assert float(calibrated_nll(val_lp, val_y, test_lp, test_y)) == found["nll"]


def test_a_degenerate_fit_is_reported_not_raised() -> None:
    constant = torch.full((10, 3), -math.log(3), dtype=torch.float64)
    y = torch.arange(10) % 3
    found = calibrated_metrics(constant, y, constant, y)
    assert set(found) == {"error"} and "degenerate" in str(found["error"])
    assert math.isnan(float(calibrated_nll(constant, y, constant, y)))


def test_the_ensemble_at_k_members_is_k_members() -> None:
    curve = [1.0, 0.8, 0.75, 0.7]
    for k, value in enumerate(curve, start=1):
        assert deep_ensemble_equivalent(value, curve) == k
    assert deep_ensemble_equivalent(0.9, curve) == pytest.approx(1.5)
    assert deep_ensemble_equivalent(0.72, curve) == pytest.approx(3.6)
    assert deep_ensemble_equivalent(1.2, curve) == -math.inf
    assert deep_ensemble_equivalent(0.5, curve) == math.inf
    assert (dee_text(-math.inf, 4), dee_text(math.inf, 4), dee_text(2.345, 4)) == (
        "< 1",
        "> 4",
        "2.35",
    )
    assert math.isnan(deep_ensemble_equivalent(0.9, [1.0, math.nan]))


def test_dee_takes_the_first_crossing_of_a_curve_that_turns_back() -> None:
    curve = [1.0, 0.7, 0.8, 0.6]
    assert deep_ensemble_equivalent(0.75, curve) == pytest.approx(1 + 0.25 / 0.3)


def _calibrated_synthetic(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A well-calibrated predictive: correct with probability its confidence."""
    gen = torch.Generator().manual_seed(seed)
    conf = torch.rand(n, generator=gen, dtype=torch.float64) * 0.5 + 0.5
    right = torch.rand(n, generator=gen, dtype=torch.float64) < conf
    probs = torch.stack([conf, 1 - conf], 1)
    return probs.log(), (~right).long()


def test_ece_point_is_inside_its_bias_corrected_interval() -> None:
    """Where the plain percentile interval misses the point (the bootstrap sits above a
    small ECE), the bias-corrected one holds it; and for every seed here too."""
    missed = 0
    for seed in range(12):
        lp, y = _calibrated_synthetic(300, seed)
        est = bootstrap("ece", lp, y, resamples=400, seed=seed)
        assert est.kind == "bias-corrected"
        assert est.low <= est.value <= est.high, (seed, est)
        counts = resample_counts(300, 400, seed)
        low, _ = _percentiles(_resampled("ece", lp, y, counts, 20), 0.95)
        missed += low > est.value
    assert missed > 0  # the plain percentile interval would have shown the reported bug


def test_other_metrics_keep_the_percentile_interval() -> None:
    lp, y = _calibrated_synthetic(200, 0)
    for metric in ("nll", "accuracy", "aurc"):
        est = bootstrap(metric, lp, y, resamples=300)
        assert est.kind == "percentile" and est.low <= est.value <= est.high


def test_an_ensembles_calibrated_nll_by_members(short_starts: Any, mnist5k_prepared: Any) -> None:
    """``calibrate``: after k members the k-member average tempered at its own T; the last
    row equals the calibrated NLL of the final predictive."""
    start, prepared = short_starts["pretrain"], mnist5k_prepared.prepared
    splits = {
        "val": (start.model_input(prepared.val.x, CPU), prepared.val.y),
        "test": (start.model_input(prepared.test.x, CPU), prepared.test.y),
    }
    found = evaluate(start, "ensemble", splits, calibrate=("val", "test"), device=CPU)
    rows = found["test"].by_samples
    assert len(rows) == 2 and all("nll_calibrated" in r for r in rows)
    assert "nll_calibrated" not in found["val"].by_samples[0]
    last = calibrated_nll(
        found["val"].log_probs, prepared.val.y, found["test"].log_probs, prepared.test.y
    )
    assert rows[-1]["nll_calibrated"] == pytest.approx(float(last), abs=1e-12)
    single = evaluate(start, "ensemble", splits, device=CPU)["test"].by_samples
    assert [r["nll"] for r in single] == [r["nll"] for r in rows]  # nothing else changed
