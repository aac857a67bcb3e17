"""Dataset shift's numbers: the predictors' metrics per rotation and corruption, and the
NLL gap to the baseline per angle with its paired bootstrap; pure over the report inputs.

The baseline's NLL explodes under rotation, so any predictor less over-confident than it
shows a growing gap; the temperature-scaled baseline (a single network, no averaging) is
the control a Bayesian predictor's growth is measured against."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...inputs import PredictorResult, ReportInputs, is_bayesian
from ...intervals import Interval, paired_bootstrap, resample_counts

ROTATE = "rotate_"


SHIFT_METRICS = ("accuracy", "nll", "ece", "brier", "entropy")


# Rotations from this angle on count as "large" for the shift claim.
LARGE_ANGLE = 90.0


def bootstrap_params(inputs: ReportInputs) -> tuple[int, int]:
    """(resamples, seed) of the report's paired bootstraps."""
    report = inputs.params.get("report", {})
    boot = report.get("bootstrap", {}) if isinstance(report, dict) else {}
    boot = boot if isinstance(boot, dict) else {}
    return int(boot.get("resamples", 2000)), int(boot.get("seed", 0))


def shift_metrics(p: PredictorResult) -> dict[str, dict[str, float]]:
    """The predictor's shift metrics, or {} when absent or malformed."""
    shift = p.metrics.get("shift")
    return shift if isinstance(shift, dict) else {}


def angles(p: PredictorResult) -> list[tuple[float, str]]:
    """(angle in degrees, shift name) of the predictor's rotations, by angle."""
    found = []
    for name in shift_metrics(p):
        if name.startswith(ROTATE):
            try:
                found.append((float(name[len(ROTATE) :]), name))
            except ValueError:
                continue
    return sorted(found)


CIFAR_C = "c_"  # CIFAR-10-C's shifts: aggregated by severity in their own section


def corruptions(p: PredictorResult) -> list[str]:
    """The predictor's non-rotation shifts but CIFAR-10-C's, sorted."""
    return sorted(n for n in shift_metrics(p) if not n.startswith((ROTATE, CIFAR_C)))


def shift_value(p: PredictorResult, name: str, key: str) -> float:
    value = shift_metrics(p).get(name, {}).get(key)
    return float(value) if isinstance(value, int | float) else math.nan


def corruption_summary(p: PredictorResult) -> dict[str, Any] | None:
    """Mean of each shift metric over the corruptions and the worst one (by NLL)."""
    names = corruptions(p)
    if not names:
        return None
    means = {k: float(np.mean([shift_value(p, n, k) for n in names])) for k in SHIFT_METRICS}
    worst = max(names, key=lambda n: (shift_value(p, n, "nll"), n))
    return {"means": means, "worst": worst, "worst_nll": shift_value(p, worst, "nll")}


@dataclass(frozen=True)
class Range:
    """A value and its 95% bootstrap percentile interval."""

    value: float
    low: float
    high: float


@dataclass(frozen=True)
class ShiftGap:
    """NLL(baseline) - NLL(predictor) per angle (positive: the predictor is better);
    ``intervals`` the paired bootstraps of NLL(predictor) - NLL(baseline) (None without
    per-point predictions); ``growth`` the mean gap over the large angles minus the gap at 0.
    ``bayesian``: whether the predictor averages (else a single network, shown as a
    control); ``beyond``: the growth of NLL(control) - NLL(predictor), i.e. its growth
    minus the control's on the same resamples (None for the control itself, without one,
    or without per-point predictions)."""

    predictor: str
    angles: list[float]
    gap: list[float]
    intervals: list[Interval | None]
    growth: Range | None
    bayesian: bool = True
    beyond: Range | None = None

    def bounds(self) -> tuple[list[float], list[float]] | None:
        """The gap's interval per angle, or None unless every angle has one."""
        if any(iv is None for iv in self.intervals):
            return None
        return [-iv.high for iv in self.intervals], [-iv.low for iv in self.intervals]


def _tensors(p: PredictorResult, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    pred = p.predictions
    if pred is None or pred.shift_y is None or name not in pred.shift_log_probs:
        return None
    return torch.from_numpy(np.asarray(pred.shift_log_probs[name])), torch.from_numpy(
        np.asarray(pred.shift_y)
    )


def _per_point_nll(log_probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -log_probs.double().gather(1, y.long()[:, None])[:, 0]


def _growth(
    base: PredictorResult, p: PredictorResult, large: list[str], zero: str, boot: tuple[int, int]
) -> Range | None:
    """Paired bootstrap over the shifted subset of mean gap(large angles) - gap(0); the
    resamples are the report's (one seed), so two growths' difference is paired too."""
    per_angle = []
    for name in [zero, *large]:
        b, q = _tensors(base, name), _tensors(p, name)
        if b is None or q is None or b[0].shape != q[0].shape:
            return None
        per_angle.append(_per_point_nll(*b) - _per_point_nll(*q))
    growth = torch.stack(per_angle[1:]).mean(0) - per_angle[0]
    resamples, seed = boot
    counts = resample_counts(growth.shape[0], resamples, seed)
    diffs = counts @ growth / growth.shape[0]
    low, high = torch.quantile(diffs, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return Range(float(growth.mean()), low, high)


def shift_gap(
    base: PredictorResult,
    p: PredictorResult,
    boot: tuple[int, int],
    control: PredictorResult | None = None,
) -> ShiftGap | None:
    """The predictor's NLL gap to the baseline per angle, and its growth beyond the
    control's when one is given (and is not the predictor); None without common angles."""
    common = [(a, n) for a, n in angles(p) if n in shift_metrics(base)]
    if not common:
        return None
    resamples, seed = boot
    gaps: list[float] = []
    intervals: list[Interval | None] = []
    for _, name in common:
        b, q = _tensors(base, name), _tensors(p, name)
        if b is not None and q is not None and b[0].shape == q[0].shape:
            iv = paired_bootstrap("nll", b[0], q[0], b[1].long(), resamples, seed)
            gaps.append(-iv.diff)
            intervals.append(iv)
        else:
            gaps.append(shift_value(base, name, "nll") - shift_value(p, name, "nll"))
            intervals.append(None)
    zero = next((n for a, n in common if a == 0.0), None)
    large = [n for a, n in common if a >= LARGE_ANGLE]
    growth = beyond = None
    if zero is not None and large:
        growth = _growth(base, p, large, zero, boot)
        if control is not None and control.name != p.name:
            beyond = _growth(control, p, large, zero, boot)
    degrees = [a for a, _ in common]
    return ShiftGap(p.name, degrees, gaps, intervals, growth, is_bayesian(p), beyond)


def temperature_control(inputs: ReportInputs, base: PredictorResult) -> PredictorResult | None:
    """The baseline's method as a single network with a temperature fitted on validation
    (``map_ts``): calibrated but averaging nothing. ``<baseline>_ts`` first, else the
    first such predictor in table order; None when the run has none."""
    found = [
        p
        for p in inputs.predictors
        if p.name != base.name
        and p.method == base.method
        and not is_bayesian(p)
        and math.isfinite(p.metric("temperature"))
        and angles(p)
    ]
    return min(found, key=lambda p: p.name != f"{base.name}_ts", default=None)


def shift_gaps(inputs: ReportInputs, base: PredictorResult) -> list[ShiftGap]:
    """The gap of every predictor with shift metrics but the baseline, in table order:
    the Bayesian ones and the single networks that are their controls."""
    boot = bootstrap_params(inputs)
    control = temperature_control(inputs, base)
    found = [
        shift_gap(base, p, boot, control)
        for p in inputs.predictors
        if p.name != base.name and angles(p)
    ]
    return [g for g in found if g is not None]


def large_gap(g: ShiftGap) -> float:
    """The mean gap over the large angles (NaN without any)."""
    values = [v for a, v in zip(g.angles, g.gap, strict=True) if a >= LARGE_ANGLE]
    return float(np.mean(values)) if values else math.nan


def growth_verdict(g: ShiftGap) -> bool | None:
    """True: the gap grows with angle beyond noise and is positive at the large angles;
    False: it shrinks beyond noise; None: within noise or no per-point predictions."""
    if g.growth is None:
        return None
    if g.growth.low > 0:
        return large_gap(g) > 0
    if g.growth.high < 0:
        return False
    return None


def large_gap_beyond(g: ShiftGap, control: ShiftGap) -> float:
    """Mean NLL(control) - NLL(predictor) over the large angles (NaN without any)."""
    return large_gap(g) - large_gap(control)


def control_verdict(g: ShiftGap, control: ShiftGap) -> bool | None:
    """True: the gap grows beyond the control's growth and the predictor beats the control
    at the large angles; False: it grows less than the control's beyond noise; None:
    neither, or no interval."""
    if g.beyond is None:
        return None
    if g.beyond.low > 0:
        return True if large_gap_beyond(g, control) > 0 else None
    if g.beyond.high < 0:
        return False
    return None
