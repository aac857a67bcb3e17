"""The numbers behind the analyses: pure functions over the report inputs, no drawing.

Every paper claim an analysis checks is decided here from these numbers, so
a test can plant a landscape or a correlation and read the verdict back.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..intervals import Interval, paired_bootstrap, resample_counts
from ..methods import REGISTRY
from .distributed import SigmaCurve, flat_range, sigma_curve_of
from .inputs import LineData, PredictorResult, RayData, ReportInputs

ROTATE = "rotate_"
SHIFT_METRICS = ("accuracy", "nll", "ece", "brier", "entropy")
# Rotations from this angle on count as "large" for the shift claim.
LARGE_ANGLE = 90.0
# The DSWAG paper's Fig. 6: accuracy "remains almost flat" out to 100 sigma.
PAPER_FLAT_MULTIPLE = 100.0
# |rho| below this is trivially small, whatever its p-value.
MIN_RHO = 0.3
# Exact permutation test up to this many points, seeded random permutations beyond.
EXACT_PERMUTATIONS_MAX = 8
RANDOM_PERMUTATIONS = 20000


def is_bayesian(p: PredictorResult) -> bool:
    """Whether the predictor averages several networks (single networks have MI = 0)."""
    method = REGISTRY.get(p.method)
    return method is None or method.samples != "one"


def bootstrap_params(inputs: ReportInputs) -> tuple[int, int]:
    """(resamples, seed) of the report's paired bootstraps."""
    report = inputs.params.get("report", {})
    boot = report.get("bootstrap", {}) if isinstance(report, dict) else {}
    boot = boot if isinstance(boot, dict) else {}
    return int(boot.get("resamples", 2000)), int(boot.get("seed", 0))


# ---------------------------------------------------------------- dataset shift


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


def corruptions(p: PredictorResult) -> list[str]:
    """The predictor's non-rotation shifts, sorted."""
    return sorted(name for name in shift_metrics(p) if not name.startswith(ROTATE))


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
    per-point predictions); ``growth`` the mean gap over the large angles minus the gap at 0."""

    predictor: str
    angles: list[float]
    gap: list[float]
    intervals: list[Interval | None]
    growth: Range | None

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
    """Paired bootstrap over the shifted subset of mean gap(large angles) - gap(0)."""
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


def shift_gap(base: PredictorResult, p: PredictorResult, boot: tuple[int, int]) -> ShiftGap | None:
    """The predictor's NLL gap to the baseline per angle; None without common angles."""
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
    growth = _growth(base, p, large, zero, boot) if zero is not None and large else None
    return ShiftGap(p.name, [a for a, _ in common], gaps, intervals, growth)


def shift_gaps(inputs: ReportInputs, base: PredictorResult) -> list[ShiftGap]:
    """The gap of every Bayesian predictor with shift metrics, in table order."""
    boot = bootstrap_params(inputs)
    found = [
        shift_gap(base, p, boot)
        for p in inputs.predictors
        if p.name != base.name and is_bayesian(p) and angles(p)
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


# ---------------------------------------------------------------- OOD detection

OOD_SCORES = (
    ("msp", "1 - max p"),
    ("entropy", "H[p̄]"),
    ("mutual_info", "MI"),
)
OOD_KEYS = (
    ("auroc", "AUROC"),
    ("aupr_in", "AUPR-In"),
    ("aupr_out", "AUPR-Out"),
    ("fpr95", "FPR95"),
)


def ood_metrics(p: PredictorResult) -> dict[str, dict[str, dict[str, float]]]:
    ood = p.metrics.get("ood")
    return ood if isinstance(ood, dict) else {}


def ood_sets(inputs: ReportInputs) -> list[str]:
    """Every OOD set any predictor was scored on, sorted."""
    return sorted({s for p in inputs.predictors for s in ood_metrics(p)})


def ood_value(p: PredictorResult, ood_set: str, score: str, key: str) -> float:
    value = ood_metrics(p).get(ood_set, {}).get(score, {}).get(key)
    return float(value) if isinstance(value, int | float) else math.nan


def auroc_se(auroc: float, n_in: int, n_ood: int) -> float:
    """Hanley & McNeil's (1982) standard error of an AUROC from n_in and n_ood points."""
    q1, q2 = auroc / (2 - auroc), 2 * auroc**2 / (1 + auroc)
    var = (auroc * (1 - auroc) + (n_ood - 1) * (q1 - auroc**2) + (n_in - 1) * (q2 - auroc**2)) / (
        n_in * n_ood
    )
    return math.sqrt(max(var, 0.0))


def ood_counts(p: PredictorResult, ood_set: str) -> tuple[int, int] | None:
    """(in-distribution, OOD) points behind the predictor's OOD scores, when known."""
    pred = p.predictions
    if pred is None:
        return None
    test = pred.ood_scores.get("test", {}).get("entropy")
    ood = pred.ood_scores.get(ood_set, {}).get("entropy")
    if test is None or ood is None:
        return None
    return len(test), len(ood)


def auroc_margin(base: PredictorResult, p: PredictorResult, ood_set: str) -> float | None:
    """Two standard errors of the AUROC difference (unpaired, hence conservative); None
    when the point counts are unknown."""
    counts = ood_counts(p, ood_set) or ood_counts(base, ood_set)
    if counts is None:
        return None
    a, b = ood_value(base, ood_set, "entropy", "auroc"), ood_value(p, ood_set, "entropy", "auroc")
    return 2 * math.hypot(auroc_se(a, *counts), auroc_se(b, *counts))


# ---------------------------------------------------------------- landscape


def line_series(line: LineData, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(t, value) along the line, sorted by t; missing values dropped."""
    pairs = sorted(
        (float(r["t"]), float(r[key])) for r in line.rows if r.get(key) is not None and "t" in r
    )
    if not pairs:
        return np.zeros(0), np.zeros(0)
    t, v = zip(*pairs, strict=True)
    return np.asarray(t), np.asarray(v)


def total_loss(line: LineData) -> tuple[np.ndarray, np.ndarray]:
    """Train loss with the weight-decay term, (t, value)."""
    t, loss = line_series(line, "train_loss")
    t2, wd = line_series(line, "weight_decay_term")
    if len(t2) != len(t) or not np.array_equal(t, t2):
        return np.zeros(0), np.zeros(0)
    return t, loss + wd


@dataclass(frozen=True)
class LineMinimum:
    """Where the train loss is lowest on the line and whether t = 0 lies on a slope."""

    t_min: float
    loss_min: float
    loss_at_0: float
    loss_next: float
    t_next: float
    t_last: float = math.inf

    @property
    def on_slope(self) -> bool:
        """The loss falls from t = 0 towards the next t on the b side."""
        return self.loss_next < self.loss_at_0


def line_minimum(line: LineData, key: str = "train_loss") -> LineMinimum | None:
    """The minimum of ``key`` along the line; None without t = 0 and a later t."""
    t, v = line_series(line, key)
    if len(t) == 0 or 0.0 not in t:
        return None
    i0 = int(np.flatnonzero(t == 0.0)[0])
    if i0 + 1 >= len(t):
        return None
    i = int(np.argmin(v))
    return LineMinimum(
        float(t[i]), float(v[i]), float(v[i0]), float(v[i0 + 1]), float(t[i0 + 1]), float(t[-1])
    )


def edge_verdict(m: LineMinimum) -> bool | None:
    """SGD at the edge of the basin, SWA near its centre: the minimum on the SWA side
    (t > 0.5) and t = 0 on a slope. A minimum at the grid's last t (beyond SWA) leaves it
    undecided: the loss still falls past SWA, so SWA is no centre along this line either."""
    if m.t_min > 0.5 and m.on_slope:
        return None if m.t_min >= m.t_last else True
    return False


def ray_grid_end(ray: RayData) -> float:
    return max((float(r["distance"]) for r in ray.rows), default=math.nan)


def ray_widths(ray: RayData) -> list[float]:
    """Widths per direction; a direction whose loss never rose by delta counts as the grid's
    end (a lower bound)."""
    end = ray_grid_end(ray)
    return [end if w is None else float(w) for w in ray.widths]


@dataclass(frozen=True)
class WidthComparison:
    narrow: str
    wide: str
    mean_narrow: float
    mean_wide: float
    wider: int
    narrower: int
    directions: int
    censored: int

    @property
    def verdict(self) -> bool | None:
        """True: wider on average and in most directions; False: not wider on average
        and narrower in most; None: the directions disagree."""
        half = self.directions / 2
        if self.mean_wide > self.mean_narrow and self.wider > half:
            return True
        if self.mean_wide <= self.mean_narrow and self.narrower > half:
            return False
        return None


def compare_widths(narrow: RayData, wide: RayData) -> WidthComparison | None:
    """``wide``'s widths against ``narrow``'s, direction by direction (the same directions)."""
    a, b = ray_widths(narrow), ray_widths(wide)
    n = min(len(a), len(b))
    if n == 0:
        return None
    a, b = a[:n], b[:n]
    censored = sum(w is None for w in [*narrow.widths[:n], *wide.widths[:n]])
    return WidthComparison(
        narrow.trajectory,
        wide.trajectory,
        float(np.mean(a)),
        float(np.mean(b)),
        sum(y > x for x, y in zip(a, b, strict=True)),
        sum(y < x for x, y in zip(a, b, strict=True)),
        n,
        censored,
    )


# One builder and one reach for every sigma-distance curve (the sweep's and these).
sigma_curve = sigma_curve_of
flat_up_to = flat_range


def flat_verdict(
    curve: SigmaCurve, reach: float, claimed: float = PAPER_FLAT_MULTIPLE
) -> bool | None:
    """True: flat out to the claimed m; False: it drops before; None: flat to the grid's
    end, which stops short of the claimed m."""
    if reach >= claimed:
        return True
    if reach < curve.multiples[-1]:
        return False
    return None


# ---------------------------------------------------------------- sharpness


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


def permutation_p(x: list[float], y: list[float], seed: int = 0) -> float:
    """One-sided p-value of rho >= the observed under exchangeable y: exact for few points,
    seeded random permutations beyond."""
    rx, ry = ranks(np.asarray(x)), ranks(np.asarray(y))
    observed = _pearson(rx, ry)
    if len(rx) <= EXACT_PERMUTATIONS_MAX:
        order = np.asarray(list(itertools.permutations(range(len(ry)))))
    else:
        rng = np.random.default_rng(seed)  # the stream rng.permutation(ry) would draw
        drawn = [rng.permutation(len(ry)) for _ in range(RANDOM_PERMUTATIONS)]
        order = np.asarray([np.arange(len(ry)), *drawn])
    rhos = _pearson_rows(rx, ry[order])
    return float(np.mean(rhos >= observed - 1e-12))


def _pearson_rows(x: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """``_pearson(x, row)`` for every row of ``ys`` at once. On ranks every sum is of
    halves and small integers, so exact: the same numbers as one row at a time."""
    xc = x - x.mean()
    yc = ys - ys.mean(axis=1, keepdims=True)
    denom = np.sqrt((xc**2).sum() * (yc**2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (xc * yc).sum(axis=1) / denom, np.nan)


@dataclass(frozen=True)
class Correlation:
    x: str
    y: str
    rho: float
    p: float
    n: int


def correlation(predictors: list[PredictorResult], x: str, y: str) -> Correlation | None:
    """Spearman's rho of metric x against y over the predictors that have both (x > 0)."""
    pairs = [
        (p.metric(x), p.metric(y))
        for p in predictors
        if p.metric(x) > 0 and math.isfinite(p.metric(x)) and math.isfinite(p.metric(y))
    ]
    if len(pairs) < 3:
        return None
    xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
    rho = spearman(xs, ys)
    if not math.isfinite(rho):
        return None
    return Correlation(x, y, rho, permutation_p(xs, ys), len(pairs))


def flat_calibrated_verdict(found: list[Correlation]) -> bool | None:
    """True: every rho with ECE and NLL is >= MIN_RHO with p < 0.05; False: none is
    positive; None: mixed, small or within noise."""
    if not found:
        return None
    if all(c.rho >= MIN_RHO and c.p < 0.05 for c in found):
        return True
    if all(c.rho <= 0 for c in found):
        return False
    return None
