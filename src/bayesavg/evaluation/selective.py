"""Selective prediction (ALGORITHMS §11): how the error falls as a predictor abstains on
its least confident points.

Points are ranked by confidence (the maximum of the averaged predictive), most confident
first, ties broken by index (a stable sort). The risk at coverage k/N is the error rate
among the first k; AURC is its mean over k = 1..N, AUGRC (Traub et al. 2024) the mean of
the generalized risk (errors among the first k) / N.

Each is written for a bootstrap resample too, given as multinomial counts over the points
(``report.intervals``): a resample repeats point i c_i times, in the same order (its
copies tie with each other, and break ties by index alike), so the metric is a sum over
blocks of equal points with closed forms per block. Every resample then costs a few
matrix operations instead of a sort.
"""

from __future__ import annotations

import math

import torch

COVERAGES = (0.9, 0.95)


def ranked_errors(log_probs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, errors): the points by confidence, most confident first, ties by index, and
    each ranked point's error (1.0 wrong, 0.0 right), float64."""
    probs = log_probs.double().exp()
    conf, pred = probs.max(dim=1)
    order = torch.sort(conf, descending=True, stable=True).indices
    return order, (pred != y).double()[order]


def risk_coverage(log_probs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(coverage k/N, risk: error rate among the k most confident) for k = 1..N."""
    _, errors = ranked_errors(log_probs, y)
    k = torch.arange(1, errors.numel() + 1, dtype=torch.float64, device=errors.device)
    return k / errors.numel(), errors.cumsum(0) / k


def selective_metrics(log_probs: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """aurc, augrc and the risk at 90% and 95% coverage, as 0-d tensors."""
    counts = torch.ones(1, y.shape[0], dtype=torch.float64, device=log_probs.device)
    return {key: value[0] for key, value in resampled(log_probs, y, counts).items()}


def coverage_key(coverage: float) -> str:
    return f"risk_at_{round(100 * coverage)}"


def resampled(
    log_probs: torch.Tensor, y: torch.Tensor, counts: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Every selective metric of every resample (a row of ``counts``) at once.

    With point i (in rank order) repeated c_i times, C_i the cumulative count and E_i
    the cumulative errors through point i, the k-th ranked copy inside block i has
    E_{i-1} + e_i j errors before it for j = 1..c_i, so the block adds
    sum_j (E_{i-1} + e_i j) / (C_{i-1} + j) = E_{i-1} dH + e_i (c_i - C_{i-1} dH) to
    the AURC's sum, with dH = H(C_i) - H(C_{i-1}) of the harmonic numbers H, and
    c_i E_{i-1} + e_i c_i (c_i + 1) / 2 to the AUGRC's.
    """
    order, errors = ranked_errors(log_probs, y)
    c = counts.to(torch.float64)[:, order.to(counts.device)]
    e = errors.to(c.device)
    n = c.sum(1)
    total = round(float(n.max()))
    steps = torch.arange(1, total + 1, dtype=torch.float64, device=c.device)
    harmonic = torch.cat([steps.new_zeros(1), (1.0 / steps).cumsum(0)])
    upto = c.cumsum(1)
    before = upto - c
    errs_upto = (c * e).cumsum(1)
    errs_before = errs_upto - c * e
    dh = harmonic[upto.round().long()] - harmonic[before.round().long()]
    aurc = (errs_before * dh + e * (c - before * dh)).sum(1) / n
    augrc = (c * errs_before + e * c * (c + 1) / 2).sum(1) / (n * n)
    out = {"aurc": aurc, "augrc": augrc}
    for coverage in COVERAGES:
        k = torch.ceil(coverage * n - 1e-9)[:, None]
        inside = (before < k) & (upto >= k)
        errs_at_k = (inside * (errs_before + e * (k - before))).sum(1)
        out[coverage_key(coverage)] = errs_at_k / k[:, 0]
    return out


def perfect_aurc(n: int, errors: int) -> float:
    """The least AURC of ``n`` points of which ``errors`` are wrong: every error ranked
    last, so the risk is 0 up to coverage (n - errors) / n."""
    right = n - errors
    return sum((k - right) / k for k in range(right + 1, n + 1)) / n if n else math.nan
