"""Uncertainty of a comparison between two predictors on the same test points.

A difference of one test image in 1,000 is not an improvement. Two
predictors evaluated on the same points are compared by a paired
bootstrap: the points are resampled with replacement (the same resample for
both), the metric difference is recomputed on each resample, and the
percentile interval of those differences is reported. Every resample is a
row of multinomial counts over the points, so accuracy, NLL and Brier (means
of per-point values) and ECE (binned, hence not a mean of per-point values)
are all computed for all resamples at once as matrix products. Accuracy
also has an exact paired test, McNemar's: only the points where exactly one
predictor is right carry information.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..evaluation.metrics import accuracy, brier, ece, nll
from ..evaluation.selective import resampled as selective_resampled
from ..evaluation.selective import selective_metrics

PerPoint = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _correct(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (log_probs.argmax(1) == y).double()


def _nll(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -log_probs.double().gather(1, y[:, None])[:, 0]


def _brier(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    probs = log_probs.double().exp()
    return ((probs - torch.nn.functional.one_hot(y, probs.shape[1]).double()) ** 2).sum(1)


def _confidence(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return log_probs.double().exp().max(1).values


def _mean_confidence(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean over points of the largest averaged probability (how sure it claims to be)."""
    return _confidence(log_probs, y).mean()


PER_POINT: dict[str, PerPoint] = {
    "accuracy": _correct,
    "nll": _nll,
    "brier": _brier,
    "confidence": _confidence,
}
SELECTIVE = ("aurc", "augrc", "risk_at_90", "risk_at_95")


def _selective(key: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return lambda log_probs, y: selective_metrics(log_probs, y)[key]


FULL: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "accuracy": accuracy,
    "nll": nll,
    "brier": brier,
    "ece": ece,
    **{key: _selective(key) for key in SELECTIVE},
    "confidence": _mean_confidence,  # compared on request (DSWAG's 'more confident' claim)
}
LOWER_IS_BETTER = {
    "accuracy": False,
    "nll": True,
    "brier": True,
    "ece": True,
    **dict.fromkeys(SELECTIVE, True),
    "confidence": False,  # 'better': more confident, which is not better calibrated
}
# Binned ECE's bootstrap is biased upwards (resampling adds bin noise), often so far
# that the point falls below its percentile interval: its own interval is bias-corrected.
# A difference of two predictors gets the percentile interval whatever the metric, as
# ALGORITHMS §10 says: for ECE the bias is larger for the better calibrated predictor,
# so the interval leans towards 0 for an improvement (conservative), never away from it.
BIASED = ("ece",)


@dataclass(frozen=True)
class Interval:
    """``diff`` = metric(B) - metric(A) on all points, and its ``level`` percentile
    interval; ``p_value`` is the bootstrap's two-sided p for a difference of 0 (twice the
    share of resampled differences on the far side of 0), for multiplicity corrections."""

    metric: str
    diff: float
    low: float
    high: float
    level: float
    resamples: int
    p_value: float = math.nan

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def verdict(self) -> str:
        """'better', 'worse' (B against A, the interval excluding 0) or 'within noise'."""
        if not self.excludes_zero():
            return "within noise"
        better = self.high < 0 if LOWER_IS_BETTER[self.metric] else self.low > 0
        return "better" if better else "worse"


@functools.lru_cache(maxsize=8)
def resample_counts(n: int, resamples: int, seed: int) -> torch.Tensor:
    """(resamples, n) float64 counts: row r says how often each point is in resample r.

    Cached: a report draws the same resamples for every predictor and comparison of a
    split (the same seed), so they are drawn once; callers only read them.
    """
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (resamples, n), generator=generator)
    counts = torch.zeros(resamples, n, dtype=torch.float64)
    counts.scatter_add_(1, idx, torch.ones(resamples, n, dtype=torch.float64))
    return counts


def _weighted_ece(
    log_probs: torch.Tensor, y: torch.Tensor, counts: torch.Tensor, n_bins: int
) -> torch.Tensor:
    """ECE of every resample at once: bin sums weighted by the resample's counts."""
    probs = log_probs.double().exp()
    conf, pred = probs.max(1)
    correct = (pred == y).double()
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64)
    idx = (torch.bucketize(conf, edges, right=False) - 1).clamp(0, n_bins - 1)
    member = torch.nn.functional.one_hot(idx, n_bins).double()
    conf_sum = counts @ (member * conf[:, None])
    acc_sum = counts @ (member * correct[:, None])
    return (acc_sum - conf_sum).abs().sum(1) / counts.sum(1)


def paired_bootstrap(
    metric: str,
    log_probs_a: torch.Tensor,
    log_probs_b: torch.Tensor,
    y: torch.Tensor,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    ece_bins: int = 20,
) -> Interval:
    """The paired bootstrap percentile interval of metric(B) - metric(A) over the test
    points, and the bootstrap p-value of no difference."""
    if metric not in FULL:
        raise ValueError(f"unknown metric {metric!r}; one of {', '.join(FULL)}")
    a, b, y = log_probs_a.cpu(), log_probs_b.cpu(), y.cpu()
    if a.shape != b.shape or a.shape[0] != y.shape[0]:
        raise ValueError(
            f"log-probabilities {tuple(a.shape)}, {tuple(b.shape)} for {len(y)} labels"
        )
    counts = resample_counts(y.shape[0], resamples, seed)
    diffs = _resampled(metric, b, y, counts, ece_bins) - _resampled(metric, a, y, counts, ece_bins)
    diff = _full(metric, b, y, ece_bins) - _full(metric, a, y, ece_bins)
    low, high = _percentiles(diffs, level)
    side = min(float((diffs <= 0).double().mean()), float((diffs >= 0).double().mean()))
    return Interval(metric, diff, low, high, level, resamples, min(1.0, 2 * side))


def _resampled(
    metric: str, log_probs: torch.Tensor, y: torch.Tensor, counts: torch.Tensor, ece_bins: int
) -> torch.Tensor:
    """The metric on every resample (a row of ``counts``) at once."""
    if metric == "ece":
        return _weighted_ece(log_probs, y, counts, ece_bins)
    if metric in SELECTIVE:
        return _selective_resampled(log_probs, y, counts)[metric]
    return counts @ PER_POINT[metric](log_probs, y) / y.shape[0]


_SELECTIVE: dict[tuple[str, int], tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}


def _selective_resampled(
    log_probs: torch.Tensor, y: torch.Tensor, counts: torch.Tensor
) -> dict[str, torch.Tensor]:
    """All four selective metrics of every resample, computed once per predictive and
    resample set: a report asks for each metric of each predictor in its own interval
    and in every comparison it is part of (the baseline in all of them). Keyed by the
    predictive's bytes (cheap beside the computation) and the counts' identity; an entry
    holds its counts, so no other tensor can take that identity while it is kept."""
    digest = hashlib.sha1(log_probs.double().contiguous().numpy().tobytes())
    digest.update(y.contiguous().numpy().tobytes())
    key = (digest.hexdigest(), id(counts))
    if key not in _SELECTIVE:
        if len(_SELECTIVE) >= 256:
            _SELECTIVE.pop(next(iter(_SELECTIVE)))
        _SELECTIVE[key] = (counts, selective_resampled(log_probs, y, counts))
    return _SELECTIVE[key][1]


def _full(metric: str, log_probs: torch.Tensor, y: torch.Tensor, ece_bins: int) -> float:
    args = {"n_bins": ece_bins} if metric == "ece" else {}
    return float(FULL[metric](log_probs, y, **args))


def _percentiles(values: torch.Tensor, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    low, high = torch.quantile(values, torch.tensor([tail, 1 - tail], dtype=torch.float64))
    return float(low), float(high)


@dataclass(frozen=True)
class Estimate:
    """A metric of one predictor on all points, and its ``level`` interval: percentile,
    or for a ``BIASED`` metric percentile shifted by the bootstrap's median bias
    (``kind`` says which)."""

    metric: str
    value: float
    low: float
    high: float
    level: float
    resamples: int
    kind: str = "percentile"


def bias_corrected(value: float, resampled: torch.Tensor, level: float) -> tuple[float, float]:
    """The percentile interval shifted by the bootstrap's median bias, median(θ*) - θ:
    [θ + q_lo - m, θ + q_hi - m]. The point is inside it by construction (the median
    lies between the quantiles), which neither BCa nor the basic interval guarantees: when
    every resample exceeds the point, BCa's bias constant is infinite and the basic
    interval 2θ - q lies wholly below θ."""
    low, high = _percentiles(resampled, level)
    shift = float(torch.quantile(resampled, 0.5)) - value
    return low - shift, high - shift


def bootstrap(
    metric: str,
    log_probs: torch.Tensor,
    y: torch.Tensor,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    ece_bins: int = 20,
) -> Estimate:
    """The percentile bootstrap interval of one predictor's metric over the test points.

    The same seed draws the same resamples as ``paired_bootstrap``, so a
    predictor's interval and its comparisons rest on the same resampled sets.
    """
    if metric not in FULL:
        raise ValueError(f"unknown metric {metric!r}; one of {', '.join(FULL)}")
    lp, y = log_probs.cpu(), y.cpu()
    if lp.shape[0] != y.shape[0]:
        raise ValueError(f"log-probabilities {tuple(lp.shape)} for {len(y)} labels")
    counts = resample_counts(y.shape[0], resamples, seed)
    values, value = _resampled(metric, lp, y, counts, ece_bins), _full(metric, lp, y, ece_bins)
    if metric in BIASED:
        low, high = bias_corrected(value, values, level)
        return Estimate(metric, value, low, high, level, resamples, "bias-corrected")
    low, high = _percentiles(values, level)
    return Estimate(metric, value, low, high, level, resamples)


def carried_by(per_point: torch.Tensor) -> int:
    """The fewest points whose removal brings a summed difference to 0 or past it: how
    many test images a gain or a loss rests on (an NLL gap is often a handful of images
    one predictor is confidently wrong on)."""
    total = float(per_point.double().sum())
    if total == 0:
        return 0
    largest = torch.sort(per_point.double() * math.copysign(1.0, total), descending=True).values
    reached = torch.nonzero(torch.cumsum(largest, 0) >= abs(total) * (1 - 1e-12))
    return int(reached[0]) + 1 if len(reached) else len(largest)


def holm(p_values: list[float], alpha: float) -> list[bool]:
    """Holm's step-down: which of m tests are rejected at family-wise error ``alpha``
    (the k-th smallest p rejected while p <= alpha / (m - k + 1), as Holm 1979 and
    statsmodels: a bootstrap p of 2,000 resamples can equal the bound exactly)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for k, i in enumerate(order):
        if not p_values[i] <= alpha / (len(p_values) - k):
            break
        rejected[i] = True
    return rejected


def mcnemar(correct_a: torch.Tensor, correct_b: torch.Tensor) -> float:
    """Exact two-sided McNemar p-value for paired right/wrong outcomes: under the null, each
    of the b + c discordant points is B's win with probability 1/2."""
    a, b = correct_a.bool().cpu(), correct_b.bool().cpu()
    wins_a = int((a & ~b).sum())
    wins_b = int((~a & b).sum())
    n, k = wins_a + wins_b, min(wins_a, wins_b)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)
