"""Paired bootstrap intervals and McNemar's test against brute force and scipy."""

from __future__ import annotations

import itertools

import pytest
import torch

from bayesavg.evaluation.metrics import ece
from bayesavg.report.intervals import (
    FULL,
    bootstrap,
    carried_by,
    mcnemar,
    paired_bootstrap,
    resample_counts,
)


def _case(seed: int, n: int = 300, k: int = 4, shift: float = 0.0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    logits_a = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    logits_b = logits_a + torch.randn(n, k, generator=g, dtype=torch.float64)
    logits_b[torch.arange(n), y] += shift
    return torch.log_softmax(logits_a, 1), torch.log_softmax(logits_b, 1), y


@pytest.mark.parametrize(
    "metric", ["accuracy", "nll", "brier", "ece", "aurc", "augrc", "risk_at_90", "risk_at_95"]
)
def test_bootstrap_equals_resampling_by_hand(metric: str) -> None:
    """Each resample's difference equals the metric recomputed on the resampled points."""
    a, b, y = _case(1)
    resamples, seed = 40, 5
    got = paired_bootstrap(metric, a, b, y, resamples=resamples, seed=seed, level=0.9)
    counts = resample_counts(len(y), resamples, seed)
    diffs = []
    for row in counts:
        idx = torch.repeat_interleave(torch.arange(len(y)), row.long())
        fn = FULL[metric]
        diffs.append(float(fn(b[idx], y[idx]) - fn(a[idx], y[idx])))
    brute = torch.tensor(diffs, dtype=torch.float64)
    low, high = torch.quantile(brute, torch.tensor([0.05, 0.95], dtype=torch.float64))
    diff = float(FULL[metric](b, y) - FULL[metric](a, y))
    # the percentile interval for every metric, ECE too (ALGORITHMS §10: only a metric's
    # own interval is bias-corrected)
    assert got.low == pytest.approx(float(low), abs=1e-12)
    assert got.high == pytest.approx(float(high), abs=1e-12)
    assert got.diff == pytest.approx(diff, abs=1e-15)
    side = min(float((brute <= 0).double().mean()), float((brute >= 0).double().mean()))
    assert got.p_value == pytest.approx(min(1.0, 2 * side), abs=1e-15)
    if metric != "ece":  # binned ECE's bootstrap is biased: its point may lie outside
        assert got.low <= got.diff <= got.high


def test_counts_are_seeded_resamples_of_n() -> None:
    counts = resample_counts(50, 7, seed=3)
    assert torch.equal(counts, resample_counts(50, 7, seed=3))
    assert not torch.equal(counts, resample_counts(50, 7, seed=4))
    assert torch.equal(counts.sum(1), torch.full((7,), 50.0, dtype=torch.float64))


def test_a_predictor_against_itself_is_within_noise() -> None:
    a, _, y = _case(2)
    for metric in FULL:
        got = paired_bootstrap(metric, a, a, y, resamples=200)
        assert (got.diff, got.low, got.high) == (0.0, 0.0, 0.0)
        assert got.verdict() == "within noise"


def test_a_clearly_better_predictor_is_better_and_one_image_is_noise() -> None:
    a, b, y = _case(3, n=1000, shift=4.0)
    assert paired_bootstrap("nll", a, b, y).verdict() == "better"
    assert paired_bootstrap("accuracy", a, b, y).verdict() == "better"
    assert paired_bootstrap("accuracy", b, a, y).verdict() == "worse"
    # B differs from A on a single test image: +0.1 pp is inside the noise.
    flip = a.clone()
    wrong = int((a.argmax(1) != y).nonzero()[0])
    flip[wrong] = torch.log_softmax(torch.nn.functional.one_hot(y[wrong], 4).double() * 9, 0)
    one = paired_bootstrap("accuracy", a, flip, y)
    assert one.diff == pytest.approx(0.001)
    assert one.verdict() == "within noise"


def test_ece_of_the_full_sample_matches_the_pipeline_metric() -> None:
    a, b, y = _case(4)
    got = paired_bootstrap("ece", a, b, y, resamples=10)
    assert got.diff == pytest.approx(float(ece(b, y) - ece(a, y)), abs=1e-15)


def test_mcnemar_matches_scipy_binomtest() -> None:
    from scipy import stats as scipy_stats  # installed with scikit-learn (mlxtend's dependency)

    g = torch.Generator().manual_seed(0)
    for p_b in (0.5, 0.55, 0.7):
        ca = torch.rand(400, generator=g) < 0.6
        cb = torch.rand(400, generator=g) < p_b
        b = int((ca & ~cb).sum())
        c = int((~ca & cb).sum())
        expected = scipy_stats.binomtest(min(b, c), b + c, 0.5).pvalue
        assert mcnemar(ca, cb) == pytest.approx(expected, rel=1e-9)
    same = torch.tensor([True, False, True])
    assert mcnemar(same, same) == 1.0


def test_bad_input_is_one_clear_error() -> None:
    a, b, y = _case(5)
    with pytest.raises(ValueError, match="unknown metric 'auc'"):
        paired_bootstrap("auc", a, b, y)
    with pytest.raises(ValueError, match="for 299 labels"):
        paired_bootstrap("nll", a, b, y[:-1])


@pytest.mark.parametrize(
    "metric", ["accuracy", "nll", "brier", "ece", "aurc", "augrc", "risk_at_90", "risk_at_95"]
)
def test_single_bootstrap_equals_resampling_by_hand(metric: str) -> None:
    """A predictor's own interval: the metric recomputed on each resample, percentiles;
    for ECE shifted by the resamples' median bias (ALGORITHMS §10)."""
    a, _, y = _case(6)
    resamples, seed = 40, 2
    got = bootstrap(metric, a, y, resamples=resamples, seed=seed, level=0.9)
    values = []
    for row in resample_counts(len(y), resamples, seed):
        idx = torch.repeat_interleave(torch.arange(len(y)), row.long())
        values.append(float(FULL[metric](a[idx], y[idx])))
    brute = torch.tensor(values, dtype=torch.float64)
    low, high = torch.quantile(brute, torch.tensor([0.05, 0.95], dtype=torch.float64))
    if metric == "ece":
        shift = float(torch.quantile(brute, 0.5)) - float(FULL[metric](a, y))
        low, high = low - shift, high - shift
    assert got.low == pytest.approx(float(low), abs=1e-12)
    assert got.high == pytest.approx(float(high), abs=1e-12)
    assert got.value == pytest.approx(float(FULL[metric](a, y)), abs=1e-15)
    assert got.low <= got.value <= got.high


def test_single_bootstrap_is_seeded_and_narrows_with_more_points() -> None:
    a, _, y = _case(7, n=2000)
    one = bootstrap("nll", a, y, resamples=300, seed=1)
    assert one == bootstrap("nll", a, y, resamples=300, seed=1)
    small = bootstrap("nll", a[:200], y[:200], resamples=300, seed=1)
    assert small.high - small.low > one.high - one.low
    with pytest.raises(ValueError, match="unknown metric 'auc'"):
        bootstrap("auc", a, y)


def test_carried_by_is_the_smallest_set_whose_removal_erases_the_difference() -> None:
    """Against every subset of small samples: the fewest points to drop so that the rest
    sums to 0 or to the other side."""
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        d = torch.randn(7, generator=g).pow(3)
        total = float(d.sum())
        brute = min(
            k
            for k in range(8)
            for drop in itertools.combinations(range(7), k)
            if float(d[[i for i in range(7) if i not in drop]].sum()) * total <= 0
        )
        assert carried_by(d) == brute
    assert carried_by(torch.zeros(3)) == 0
    assert carried_by(torch.tensor([-5.0, 1.0, 1.0, 1.0])) == 1
