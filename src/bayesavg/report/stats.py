"""Small statistics the sections decide claims with: rank correlation and its permutation
test, an unpaired interval for two accuracies.

Written here rather than taken from scipy, which the library does not depend on: the
exact permutation test enumerates small samples and seeds a fixed draw for larger ones, so
the p-value is a reproducible number (tests compare it with a brute-force count).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

# Exact permutation test up to this many points, seeded random permutations beyond.
EXACT_PERMUTATIONS_MAX = 8


RANDOM_PERMUTATIONS = 20000


_Z95 = 1.959963984540054


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank."""
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    out = np.empty(len(values))
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        out[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return out


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    denom = math.sqrt(float((x**2).sum() * (y**2).sum()))
    return float((x * y).sum() / denom) if denom > 0 else math.nan


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (Pearson's of average ranks); NaN if either is constant."""
    return _pearson(ranks(np.asarray(x)), ranks(np.asarray(y)))


def clustered_permutation_p(x: list[float], y: list[float], seed: int = 0) -> float:
    """One-sided p-value of Spearman's rho >= the observed when points that share their x
    share one unit: several predictors measured at one network (swa, swag_diag and
    swag at the snapshot mean) have the same sharpness, and are not independent draws.
    The distinct x values are shuffled among the units, each unit's points moving
    together: exact for few units, seeded random permutations beyond. With every x
    distinct it is the plain permutation test."""
    values, unit = np.unique(np.asarray(x, dtype=float), return_inverse=True)
    ry = ranks(np.asarray(y))
    observed = _pearson(ranks(np.asarray(x)), ry)
    k = len(values)
    if k <= EXACT_PERMUTATIONS_MAX:
        order = np.asarray(list(itertools.permutations(range(k))))
    else:
        rng = np.random.default_rng(seed)
        drawn = [rng.permutation(k) for _ in range(RANDOM_PERMUTATIONS)]
        order = np.asarray([np.arange(k), *drawn])
    sizes = np.bincount(unit, minlength=k).astype(float)
    # unit u takes the value of rank order[u] among the distinct values: its points' average
    # rank is the count of points in units of lower value plus the middle of its own
    by_value = np.argsort(order, axis=1)  # row r: the unit holding each value, by value
    below = np.cumsum(sizes[by_value], axis=1) - sizes[by_value]
    unit_rank = np.empty_like(below)
    np.put_along_axis(unit_rank, by_value, below + (sizes[by_value] + 1) / 2, axis=1)
    rhos = _pearson_rows(ry, unit_rank[:, unit])
    return float(np.mean(rhos >= observed - 1e-12))


def _pearson_rows(x: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """``_pearson(x, row)`` for every row of ``ys`` at once. On ranks every sum is of
    halves and small integers, so exact: the same numbers as one row at a time."""
    xc = x - x.mean()
    yc = ys - ys.mean(axis=1, keepdims=True)
    denom = np.sqrt((xc**2).sum() * (yc**2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (xc * yc).sum(axis=1) / denom, np.nan)


def accuracy_interval(ours: float, theirs: float, n: int) -> tuple[float, float]:
    """95% interval of ``ours - theirs`` for two accuracies on the same ``n`` points, unpaired."""
    se = math.sqrt((ours * (1 - ours) + theirs * (1 - theirs)) / n)
    delta = ours - theirs
    return delta - _Z95 * se, delta + _Z95 * se
