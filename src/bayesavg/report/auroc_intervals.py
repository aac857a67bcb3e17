"""Paired, stratified bootstrap of the AUROC difference between two OOD detectors.

Two predictors scored on the same in-distribution (test) and OOD points are compared as
ALGORITHMS §10 asks for any two predictors on the same points: the points are resampled
with replacement, the same draws for both predictors (paired), in-distribution and OOD
points separately (stratified: every resample keeps both classes at their sizes, so its
AUROC is defined), and the percentile interval of the AUROC differences decides:
"higher" or "lower" only when it excludes 0. An unpaired test ignores that both
predictors see the same hard and easy points, and so misses most real differences.

A resample is a row of multinomial counts over the points (``intervals.resample_counts``),
so its AUROC is the weighted Mann-Whitney statistic

    sum_i sum_j c_i d_j ([s_j > t_i] + [s_j = t_i] / 2) / (sum c * sum d)

(c, d the in-distribution and OOD counts, t, s their scores; OOD the positive class),
which is ``evaluation.ood.auroc`` of the repeated points. With the in-distribution scores
sorted once, sum_i c_i [t_i < s] and sum_i c_i [t_i <= s] are cumulative sums of the
counts read at s's two insertion points: one cumulative sum and one scatter of the OOD
counts serve every resample, O(R (n_in + n_out)), with no loop over resamples. Counts are
whole numbers, so the sums are exact in float64 and only the final division rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..evaluation.ood import auroc
from .intervals import resample_counts

# The OOD stratum draws with seed + 1: with the same seed and as many OOD as test points
# both strata would repeat the same positions, tying two unrelated sets of draws.
OOD_SEED_OFFSET = 1

Scores = tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor]


@dataclass(frozen=True)
class AurocInterval:
    """``diff`` = AUROC(candidate) - AUROC(reference) on all points, and its ``level``
    percentile interval over paired, stratified resamples."""

    reference: float
    candidate: float
    diff: float
    low: float
    high: float
    level: float
    resamples: int

    def verdict(self) -> str | None:
        """'higher' or 'lower' (the candidate against the reference) when the interval
        excludes 0, else None: within noise."""
        if self.low > 0:
            return "higher"
        if self.high < 0:
            return "lower"
        return None


def _double(values: np.ndarray | torch.Tensor) -> torch.Tensor:
    found = torch.as_tensor(values).detach().cpu().to(torch.float64).flatten()
    if not bool(torch.isfinite(found).all()):
        raise ValueError("OOD scores must be finite")
    return found


def point_auroc(score_in: np.ndarray | torch.Tensor, score_out: np.ndarray | torch.Tensor) -> float:
    """The evaluation's AUROC (OOD positive), so a report's numbers match the metrics'."""
    t, s = _double(score_in), _double(score_out)
    is_ood = torch.cat([torch.zeros(t.numel()), torch.ones(s.numel())]).bool()
    return float(auroc(torch.cat([t, s]), is_ood))


def resampled_auroc(
    score_in: np.ndarray | torch.Tensor,
    score_out: np.ndarray | torch.Tensor,
    counts_in: torch.Tensor,
    counts_out: torch.Tensor,
) -> torch.Tensor:
    """The AUROC of every resample at once: row r of ``counts_in`` (R, n_in) and
    ``counts_out`` (R, n_out) says how often each point is in resample r; ties count 1/2."""
    t, s = _double(score_in), _double(score_out)
    c, d = counts_in.to(torch.float64), counts_out.to(torch.float64)
    if c.shape[1] != t.numel() or d.shape[1] != s.numel() or c.shape[0] != d.shape[0]:
        raise ValueError(
            f"counts {tuple(c.shape)}, {tuple(d.shape)} for {t.numel()} in-distribution and "
            f"{s.numel()} OOD points"
        )
    sorted_t, order = torch.sort(t, stable=True)
    cumulative = torch.nn.functional.pad(torch.cumsum(c[:, order], dim=1), (1, 0))
    below = torch.searchsorted(sorted_t, s, right=False)  # how many t < s
    up_to = torch.searchsorted(sorted_t, s, right=True)  # how many t <= s
    # Each OOD point j adds d_j (cumulative[below_j] + cumulative[up_to_j]): twice the weight
    # of in-distribution points it beats, ties half. Gathering the OOD counts by insertion
    # point first reads the cumulative sums once (not once per OOD point): all integers.
    at = torch.zeros_like(cumulative)
    at.index_add_(1, below, d)
    at.index_add_(1, up_to, d)
    return (cumulative * at).sum(1) / (2 * c.sum(1) * d.sum(1))


def _percentiles(values: torch.Tensor, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    low, high = torch.quantile(values, torch.tensor([tail, 1 - tail], dtype=torch.float64))
    return float(low), float(high)


def _check_same_points(reference: Scores, candidate: Scores) -> tuple[int, int]:
    n_in, n_out = len(reference[0]), len(reference[1])
    if (len(candidate[0]), len(candidate[1])) != (n_in, n_out):
        raise ValueError(
            f"predictors scored on different points: ({n_in}, {n_out}) and "
            f"({len(candidate[0])}, {len(candidate[1])}) in-distribution and OOD"
        )
    if n_in == 0 or n_out == 0:
        raise ValueError("the AUROC needs in-distribution and OOD points")
    return n_in, n_out


def paired_aurocs(
    reference: Scores,
    candidates: dict[str, Scores],
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, AurocInterval]:
    """Each candidate's (in-distribution, OOD) scores against the reference's, all on the
    same resamples: the reference's resampled AUROCs are computed once for all of them."""
    n_in, n_out = _check_same_points(reference, reference)
    counts_in = resample_counts(n_in, resamples, seed)
    counts_out = resample_counts(n_out, resamples, seed + OOD_SEED_OFFSET)
    ref_point = point_auroc(*reference)
    ref_resampled = resampled_auroc(*reference, counts_in, counts_out)
    found = {}
    for name, scores in candidates.items():
        _check_same_points(reference, scores)
        point = point_auroc(*scores)
        diffs = resampled_auroc(*scores, counts_in, counts_out) - ref_resampled
        low, high = _percentiles(diffs, level)
        found[name] = AurocInterval(
            ref_point, point, point - ref_point, low, high, level, resamples
        )
    return found


def paired_auroc(
    reference: Scores,
    candidate: Scores,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> AurocInterval:
    """The paired, stratified bootstrap interval of AUROC(candidate) - AUROC(reference)."""
    return paired_aurocs(reference, {"candidate": candidate}, resamples, seed, level)["candidate"]
