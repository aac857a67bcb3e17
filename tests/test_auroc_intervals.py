"""The paired, stratified AUROC bootstrap against brute force, and the OOD claim built on it."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
import test_report_analyses
import torch

from bayesavg.evaluation.ood import auroc, detection_metrics
from bayesavg.report.auroc_intervals import (
    OOD_SEED_OFFSET,
    paired_auroc,
    paired_aurocs,
    point_auroc,
    resampled_auroc,
)
from bayesavg.report.inputs import is_bayesian
from bayesavg.report.intervals import resample_counts
from bayesavg.report.sections import ood


def _tied(seed: int, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores on a coarse grid, so ties within and across the two classes are common."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 6, n_in) / 4, rng.integers(2, 8, n_out) / 4


def _brute_auroc(score_in: np.ndarray, score_out: np.ndarray) -> Fraction:
    """Every (in-distribution, OOD) pair: 1 when the OOD score is higher, 1/2 on a tie."""
    wins = sum(Fraction(2 if s > t else 1 if s == t else 0, 2) for t in score_in for s in score_out)
    return wins / (len(score_in) * len(score_out))


def _repeated(scores: np.ndarray, counts: torch.Tensor) -> np.ndarray:
    return np.repeat(scores, counts.numpy().astype(int))


def test_point_estimate_is_the_evaluations_auroc() -> None:
    for seed in range(5):
        score_in, score_out = _tied(seed, 40, 30)
        expected = float(
            detection_metrics(torch.tensor(score_in), torch.tensor(score_out))["auroc"]
        )
        assert point_auroc(score_in, score_out) == expected
        assert point_auroc(score_in, score_out) == pytest.approx(
            float(_brute_auroc(score_in, score_out)), abs=1e-15
        )
        found = paired_auroc((score_in, score_out), _tied(seed + 10, 40, 30), resamples=20)
        assert found.reference == expected


def test_every_resample_is_the_auroc_of_its_repeated_points() -> None:
    score_in, score_out = _tied(0, 12, 9)
    counts_in, counts_out = resample_counts(12, 40, 3), resample_counts(9, 40, 4)
    found = resampled_auroc(score_in, score_out, counts_in, counts_out)
    for r in range(40):
        t, s = _repeated(score_in, counts_in[r]), _repeated(score_out, counts_out[r])
        assert float(found[r]) == float(_brute_auroc(t, s))  # exact: integer sums, one division
        is_ood = torch.cat([torch.zeros(len(t)), torch.ones(len(s))]).bool()
        evaluated = float(auroc(torch.tensor(np.concatenate([t, s])), is_ood))
        assert float(found[r]) == pytest.approx(evaluated, abs=1e-14)


def test_arbitrary_counts_weight_points_as_repetitions() -> None:
    """Counts that do not sum to the number of points (zeros included) still weight each
    point as that many copies of it."""
    score_in, score_out = _tied(1, 7, 5)
    rng = np.random.default_rng(0)
    counts_in = torch.tensor(rng.integers(0, 4, (6, 7)), dtype=torch.float64)
    counts_out = torch.tensor(rng.integers(0, 4, (6, 5)), dtype=torch.float64)
    counts_in[:, 0] += 1
    counts_out[:, 0] += 1
    found = resampled_auroc(score_in, score_out, counts_in, counts_out)
    for r in range(6):
        t, s = _repeated(score_in, counts_in[r]), _repeated(score_out, counts_out[r])
        assert float(found[r]) == float(_brute_auroc(t, s))


def test_interval_is_the_percentiles_of_brute_force_paired_differences() -> None:
    reference, candidate = _tied(2, 15, 11), _tied(3, 15, 11)
    resamples, seed = 60, 5
    found = paired_auroc(reference, candidate, resamples, seed)
    counts_in = resample_counts(15, resamples, seed)
    counts_out = resample_counts(11, resamples, seed + OOD_SEED_OFFSET)

    def brute(scores: tuple[np.ndarray, np.ndarray], r: int) -> float:
        t, s = _repeated(scores[0], counts_in[r]), _repeated(scores[1], counts_out[r])
        return float(_brute_auroc(t, s))

    diffs = [brute(candidate, r) - brute(reference, r) for r in range(resamples)]
    tail = (1 - 0.95) / 2  # as level 0.95 gives it (0.025 + 2e-17)
    tails = torch.tensor([tail, 1 - tail], dtype=torch.float64)
    quantiles = torch.quantile(torch.tensor(diffs, dtype=torch.float64), tails)
    assert (found.low, found.high) == tuple(quantiles.tolist())  # the same differences, exactly
    assert found.diff == point_auroc(*candidate) - point_auroc(*reference)


def test_identical_predictors_have_the_zero_interval_and_no_verdict() -> None:
    scores = _tied(4, 50, 40)
    copy = (scores[0].copy(), scores[1].copy())
    found = paired_auroc(scores, copy, resamples=200, seed=1)
    assert (found.diff, found.low, found.high) == (0.0, 0.0, 0.0)
    assert found.verdict() is None


def test_raising_ood_scores_is_never_lower_on_any_resample() -> None:
    """Raising some OOD scores and lowering some test scores can only win pairs: every
    resample's difference is >= 0, so the interval is too; large shifts decide 'higher'."""
    rng = np.random.default_rng(5)
    score_in, score_out = rng.normal(0, 1, 300), rng.normal(1, 1, 200)
    better_out = score_out + np.where(rng.random(200) < 0.5, 0.5, 0.0)
    better_in = score_in - np.where(rng.random(300) < 0.5, 0.5, 0.0)
    found = paired_auroc((score_in, score_out), (better_in, better_out), 500, 0)
    assert found.low >= 0 and found.verdict() == "higher"
    swapped = paired_auroc((better_in, better_out), (score_in, score_out), 500, 0)
    assert swapped.high <= 0 and swapped.verdict() == "lower"
    assert swapped.diff == -found.diff


def test_the_same_seed_draws_the_same_interval() -> None:
    reference, candidate = _tied(6, 80, 60), _tied(7, 80, 60)
    first = paired_auroc(reference, candidate, 300, 11)
    resample_counts.cache_clear()  # drawn afresh, not handed the cached draws
    assert paired_auroc(reference, candidate, 300, 11) == first
    assert paired_auroc(reference, candidate, 300, 12) != first


def test_candidates_share_the_references_resamples() -> None:
    reference = _tied(8, 30, 20)
    candidates = {"a": _tied(9, 30, 20), "b": _tied(10, 30, 20)}
    together = paired_aurocs(reference, candidates, 100, 2)
    for name, scores in candidates.items():
        assert together[name] == paired_auroc(reference, scores, 100, 2)


def test_predictors_on_different_points_are_refused() -> None:
    with pytest.raises(ValueError, match="different points"):
        paired_auroc(_tied(0, 10, 8), _tied(1, 10, 9), 10)


def test_the_claim_counts_the_paired_verdicts() -> None:
    """The claim's counts are the paired verdicts of the Bayesian predictors, not their
    metrics' AUROC: a predictor whose per-point scores equal the baseline's is undecided
    even though its recorded AUROC is higher, and one without per-point scores is named."""
    inputs = test_report_analyses._inputs()
    by_name = {p.name: p for p in inputs.predictors}
    base = by_name[inputs.baseline]
    assert base.predictions is not None
    bayesian = [p.name for p in inputs.predictors if is_bayesian(p) and p is not base]
    twin, bare = bayesian[0], bayesian[1]
    changed = []
    for p in inputs.predictors:
        if p.name == twin:
            p = dataclasses.replace(p, predictions=base.predictions)
        elif p.name == bare:
            p = dataclasses.replace(p, predictions=None)
        changed.append(p)
    inputs = test_report_analyses._inputs(predictors=changed)
    intervals = ood.auroc_vs_baseline(inputs)
    assert intervals[twin].verdict() is None and bare not in intervals
    verdicts = [intervals[n].verdict() for n in bayesian if n in intervals]
    higher, lower = verdicts.count("higher"), verdicts.count("lower")
    (claim,) = ood.claims(inputs)
    assert claim.number.startswith(f"{higher} higher, {lower} lower of {len(bayesian)} vs AUROC")
    assert f"{higher} are higher and {lower} lower" in claim.evidence
    assert "paired, stratified bootstrap" in claim.evidence
    assert f"no interval: {bare}" in claim.evidence
    n = len(bayesian)
    assert claim.holds is (True if higher > n / 2 else False if higher <= lower else None)
