"""Metrics after calibration (Ashukha et al. 2020; ALGORITHMS §11): each predictor's
averaged predictive tempered by its own T fitted on validation, then NLL, ECE and Brier;
and the deep-ensemble equivalent (DEE) of a calibrated NLL.

Comparing predictors uncalibrated ranks them partly by how over- or under-confident they
happen to be, which one scalar fixes; after calibration the comparison is of what the
temperature cannot fix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..predictors.calibration import apply_temperature, fit_temperature
from .metrics import adaptive_ece, brier, classwise_ece, ece, nll

CALIBRATED = ("nll", "ece", "brier", "ece_adaptive", "ece_classwise")


def calibrated_nll(
    fit_log_probs: torch.Tensor,
    fit_y: torch.Tensor,
    log_probs: torch.Tensor,
    y: torch.Tensor,
) -> torch.Tensor:
    """NLL of ``log_probs`` tempered by the T fitted on (``fit_log_probs``, ``fit_y``);
    NaN when that fit is degenerate (``fit_temperature`` refuses it)."""
    try:
        t = fit_temperature(fit_log_probs, fit_y)
    except ValueError:
        return torch.full((), math.nan, dtype=torch.float64, device=log_probs.device)
    return nll(apply_temperature(log_probs.double(), t), y)


def calibrated_metrics(
    val_log_probs: torch.Tensor,
    val_y: torch.Tensor,
    log_probs: torch.Tensor,
    y: torch.Tensor,
    ece_bins: int = 20,
) -> dict[str, float | str]:
    """``temperature`` fitted on validation and the test metrics at it (``CALIBRATED``);
    ``error`` instead when the fit is degenerate (the predictive is constant, or always
    right with growing confidence), so a report can say why a predictor has none."""
    try:
        t = fit_temperature(val_log_probs, val_y)
    except ValueError as err:
        return {"error": str(err)}
    tempered = apply_temperature(log_probs.double(), t)
    values = {
        "nll": nll(tempered, y),
        "ece": ece(tempered, y, ece_bins),
        "brier": brier(tempered, y),
        "ece_adaptive": adaptive_ece(tempered, y, ece_bins),
        "ece_classwise": classwise_ece(tempered, y, ece_bins),
    }
    return {"temperature": t, **{k: float(v) for k, v in values.items()}}


def deep_ensemble_equivalent(value: float, by_members: Sequence[float]) -> float:
    """The number of ensemble members k (linearly interpolated between integers) whose
    calibrated NLL ``by_members[k - 1]`` equals ``value``: the first crossing of the
    curve, walking from one member up. ``-inf`` below one member (worse than a single
    network) and ``inf`` beyond all M (better than the whole ensemble); NaN without a
    curve or a value."""
    curve = [v for v in by_members if math.isfinite(v)]
    if not curve or len(curve) != len(by_members) or not math.isfinite(value):
        return math.nan
    if value > curve[0]:
        return -math.inf
    for k in range(1, len(curve)):
        a, b = curve[k - 1], curve[k]
        if min(a, b) <= value <= max(a, b):
            return float(k) if a == b else k + (a - value) / (a - b)
    return float(len(curve)) if value == curve[-1] else math.inf


def dee_text(dee: float, members: int) -> str:
    """DEE as the report shows it: '< 1', '> M', or the number to two decimals."""
    if math.isnan(dee):
        return "n/a"
    if dee == -math.inf:
        return "< 1"
    if dee == math.inf:
        return f"> {members}"
    return f"{dee:.2f}"
