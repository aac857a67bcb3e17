"""Accuracy of the single network theta_bar + m sigma z against the multiple m: the curve
the DSWAG sweep's figure and the landscape's sigma-distance figure both draw."""

from __future__ import annotations

from typing import NamedTuple

# Fig. 6: accuracy within this much of theta_bar's "stays high"; this much lower "collapses".
FLAT_TOLERANCE = 0.01


class SigmaCurve(NamedTuple):
    """Accuracy at theta_bar + m sigma z over the draws, per multiple m (sorted)."""

    multiples: list[float]
    mean: list[float]
    low: list[float]
    high: list[float]
    sigma_norm: float


def sigma_curve_of(rows: list[dict[str, float]]) -> SigmaCurve | None:
    """Mean and min-max accuracy per multiple m over the draws of sigma-distance rows
    (the sweep's and stage landscape's share the format); None without rows."""
    by_m: dict[float, list[float]] = {}
    for r in rows:
        by_m.setdefault(float(r["multiple"]), []).append(float(r["accuracy"]))
    if not by_m:
        return None
    ms = sorted(by_m)
    norms = [float(r["sigma_norm"]) for r in rows if "sigma_norm" in r]
    return SigmaCurve(
        ms,
        [sum(by_m[m]) / len(by_m[m]) for m in ms],
        [min(by_m[m]) for m in ms],
        [max(by_m[m]) for m in ms],
        max(norms, default=0.0),
    )


def flat_range(curve: SigmaCurve, tolerance: float = FLAT_TOLERANCE) -> float | None:
    """The largest m up to which every mean accuracy stays within ``tolerance`` of m = 0's.

    None when there is no m = 0 row to compare with.
    """
    if not curve.multiples or curve.multiples[0] != 0:
        return None
    reach = 0.0
    for m, acc in zip(curve.multiples, curve.mean, strict=True):
        if acc < curve.mean[0] - tolerance:
            break
        reach = m
    return reach
