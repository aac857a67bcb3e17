"""DSWAG's numbers: which predictors play the paper's roles, the worker sweep's tables, and
whether a value moves with W the claimed way; pure over the report inputs."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ...blocks import Cell, Table
from ...formats import interval_text, pct
from ...inputs import PredictorResult, ReportInputs, SweepPoint, trajectory_params
from ...intervals import resample_counts
from ...sigma_curves import FLAT_TOLERANCE, SigmaCurve, flat_range, sigma_curve_of
from ...stats import accuracy_interval
from ...uncertainty import Uncertainty

COLLAPSE_DROP = 0.10


# The sweep's predictors in the metrics JSON, with their labels.
SWEEP_PREDICTORS = (("fedavg", "FedAvg"), ("dswa", "DSWA"), ("dswag", "DSWAG"))


NO_VARIANCE = "fewer than 2 snapshots, so no variance"


class DswagRoles(NamedTuple):
    """The predictors of a kind-dswag trajectory, and the paper's baseline beside them.

    ``baseline``: a swag predictor on a (non-dswag) trajectory that starts
    from the dswag trajectory, i.e. SWAG after distributed training.
    """

    trajectory: str
    fedavg: PredictorResult | None
    dswa: PredictorResult | None
    dswag: PredictorResult | None
    baseline: PredictorResult | None


def dswag_roles(inputs: ReportInputs) -> DswagRoles | None:
    """The roles, found by trajectory kind, start and method, never by predictor name.

    Of several dswag trajectories, the first with both a DSWAG predictor and
    a baseline wins; None when no dswag trajectory has a predictor.
    """
    trajectories = trajectory_params(inputs.params)

    def on(trajectory: str, method: str) -> PredictorResult | None:
        return next(
            (p for p in inputs.predictors if p.trajectory == trajectory and p.method == method),
            None,
        )

    found = []
    for name, traj in trajectories.items():
        if traj.get("kind") != "dswag":
            continue
        baseline = next(
            (
                p
                for p in inputs.predictors
                if p.method == "swag"
                and trajectories.get(p.trajectory, {}).get("start") == name
                and trajectories.get(p.trajectory, {}).get("kind") != "dswag"
            ),
            None,
        )
        roles = DswagRoles(name, on(name, "map"), on(name, "swa"), on(name, "swag"), baseline)
        if any(p is not None for p in roles[1:]):
            found.append(roles)
    found.sort(key=lambda r: (r.dswag is None) + (r.baseline is None))
    return found[0] if found else None


def snapshots_text(point: SweepPoint) -> str:
    return f"{point.snapshots} snapshot" + ("" if point.snapshots == 1 else "s")


def w_label(point: SweepPoint) -> str:
    return f"W={point.workers}"


def no_variance(point: SweepPoint) -> bool:
    """Fewer than 2 snapshots: the SWAG diagonal is zero and DSWAG cannot sample."""
    return point.snapshots < 2


def test_size(inputs: ReportInputs, p: PredictorResult | None = None) -> int | None:
    n = p.metric("n") if p is not None else math.nan
    if not math.isfinite(n):
        n = float(inputs.dataset_summary.get("test") or math.nan)
    return int(n) if math.isfinite(n) and n > 0 else None


def steps(
    points: Sequence[SweepPoint],
    values: Sequence[float],
    rising: bool,
    fmt: Any,
    words: tuple[str, str] = ("higher", "lower"),
) -> tuple[str, str]:
    """Whether ``values`` move with W the claimed way, and the listing of them.

    NaN values are skipped; a tie is not a move; two neighbouring infinities
    (target not reached) are not compared. Returns a verdict ("holds at every
    step", "holds from the smallest to the largest W only: ...", "does not
    hold: ...", or "cannot be checked: ...") and the listing "W=a v, W=b v".
    """
    pairs = [(p, v) for p, v in zip(points, values, strict=True) if not math.isnan(v)]
    listing = ", ".join(f"{w_label(p)} {fmt(v)}" for p, v in pairs)
    if len(pairs) < 2:
        return "cannot be checked: fewer than two worker counts have it", listing

    def moves(a: float, b: float) -> bool:
        return b > a if rising else b < a

    word = words[0] if rising else words[1]
    # Two infinite values (neither reached the target) say nothing about the order.
    known = [
        (first, second)
        for first, second in itertools.pairwise(pairs)
        if not (math.isinf(first[1]) and math.isinf(second[1]))
    ]
    if not known:
        return "cannot be checked: no two neighbouring worker counts can be ordered", listing
    against = [
        f"{w_label(q)} ({fmt(b)}) is not {word} than {w_label(p)} ({fmt(a)})"
        for (p, a), (q, b) in known
        if not moves(a, b)
    ]
    unordered = [
        f"{w_label(p)} and {w_label(q)} both {fmt(a)}"
        for (p, a), (q, b) in itertools.pairwise(pairs)
        if math.isinf(a) and math.isinf(b)
    ]
    if not against:
        if unordered:
            return f"holds at every step that can be ordered ({'; '.join(unordered)})", listing
        return "holds at every step", listing
    if moves(pairs[0][1], pairs[-1][1]):
        return f"holds from the smallest to the largest W only: {'; '.join(against)}", listing
    return f"does not hold: {'; '.join(against)}", listing


def rounds_text(value: float) -> str:
    return "not reached" if math.isinf(value) else f"{value:g} rounds"


def m_text(value: float | None) -> str:
    return "n/a (no m = 0 row)" if value is None else f"m = {value:g}"


def rounds_label(point: SweepPoint) -> str:
    if point.rounds_to_target is None:
        return f"not reached in {point.rounds} rounds"
    return str(point.rounds_to_target)


def rounds_table(sweep: list[SweepPoint]) -> Table | None:
    """Rounds to the target per W and where phase 1 ended; None without a sweep."""
    if not sweep:
        return None
    header = [
        "W (clients)",
        "Rounds run",
        "Rounds to target",
        "Train accuracy (%) at the end",
        "Test accuracy (%) at the end",
        "Snapshots",
    ]
    rows = []
    for p in sweep:
        last = p.history[-1] if p.history else {}
        accs = [
            f"{100 * last[k]:.2f}" if isinstance(last.get(k), float) else "n/a"
            for k in ("train_accuracy", "test_accuracy")
        ]
        target = Cell(rounds_label(p))
        snapshots = f"{p.snapshots}" + (" (no variance)" if no_variance(p) else "")
        rows.append([Cell(str(p.workers)), Cell(str(p.rounds)), target, *map(Cell, accs)])
        rows[-1].append(Cell(snapshots))
    return Table(header, rows)


_SWEEP_COLUMNS = (
    ("accuracy", "Accuracy (%)", True, lambda v: f"{100 * v:.2f}"),
    ("nll", "NLL", False, lambda v: f"{v:.4f}"),
    ("ece", "ECE (20 bins)", False, lambda v: f"{v:.4f}"),
    ("brier", "Brier", False, lambda v: f"{v:.4f}"),
)


def sweep_table(sweep: list[SweepPoint]) -> Table | None:
    """FedAvg, DSWA and DSWAG test metrics per W; bold: the best of the three at that W."""
    if not sweep:
        return None
    header = ["W (clients)", "Predictor", *(label for _, label, _, _ in _SWEEP_COLUMNS)]
    rows = []
    for p in sweep:
        best = {}
        for key, _, higher, _ in _SWEEP_COLUMNS:
            values = [v for k, _ in SWEEP_PREDICTORS if math.isfinite(v := p.metric(k, key))]
            best[key] = (max if higher else min)(values) if values else None
        for key, label in SWEEP_PREDICTORS:
            row = [Cell(str(p.workers)), Cell(label)]
            if p.metrics.get(key) is None:
                why = NO_VARIANCE if key == "dswag" and no_variance(p) else "not evaluated"
                row += [Cell(f"n/a ({why})")] + [Cell("n/a")] * (len(_SWEEP_COLUMNS) - 1)
            else:
                for metric, _, _, fmt in _SWEEP_COLUMNS:
                    v = p.metric(key, metric)
                    row.append(Cell(fmt(v), v == best[metric]) if math.isfinite(v) else Cell("n/a"))
            rows.append(row)
    return Table(header, rows)


def point_curve(point: SweepPoint) -> SigmaCurve | None:
    """The sweep point's curve (``sigma_curve_of`` its rows)."""
    return sigma_curve_of(point.sigma_distance)


def has_variance(point: SweepPoint, curve: SigmaCurve) -> bool:
    return not no_variance(point) and curve.sigma_norm > 0


def sigma_table(sweep: list[SweepPoint]) -> Table | None:
    """Fig. 6's numbers per W; None when no point has sigma-distance rows."""
    rows = []
    for p in sweep:
        curve = point_curve(p)
        if curve is None:
            continue
        last = curve.multiples[-1]
        if not has_variance(p, curve):
            flat, at_last = f"every m (sigma = 0: {NO_VARIANCE})", "as at theta_bar"
        else:
            reach = flat_range(curve)
            flat = f"{reach:g}" if reach is not None else "n/a (no m = 0)"
            at_last = (
                f"{100 * curve.mean[-1]:.2f} ({100 * curve.low[-1]:.2f} to "
                f"{100 * curve.high[-1]:.2f})"
            )
        rows.append(
            [
                Cell(str(p.workers)),
                Cell(str(p.snapshots)),
                Cell(f"{curve.sigma_norm:.3g}"),
                Cell(f"{100 * curve.mean[0]:.2f}" if curve.multiples[0] == 0 else "n/a"),
                Cell(flat),
                Cell(at_last),
            ]
        )
    if not rows:
        return None
    header = [
        "W (clients)",
        "Snapshots",
        "||sigma||",
        "Accuracy (%) at m = 0",
        f"Within {100 * FLAT_TOLERANCE:g} pp of m = 0 up to m",
        f"Accuracy (%) at m = {last:g}: mean (min to max)",
    ]
    return Table(header, rows)


def mean_confidence(p: PredictorResult) -> tuple[float, float] | None:
    """Count-weighted mean confidence and accuracy from the reliability bins."""
    n = sum(r.get("count", 0) for r in p.reliability)
    if n <= 0:
        return None
    conf = sum(r.get("count", 0) * r["confidence"] for r in p.reliability) / n
    acc = sum(r.get("count", 0) * r["accuracy"] for r in p.reliability) / n
    return conf, acc


def confidence_gap(p: PredictorResult, unc: Uncertainty) -> tuple[float, float, float] | None:
    """Accuracy - confidence, the mean over the test points, with its percentile bootstrap
    interval on the report's resamples; None without per-point predictions."""
    if p.predictions is None:
        return None
    lp = torch.as_tensor(np.asarray(p.predictions.log_probs, dtype=np.float64))
    y = torch.as_tensor(np.asarray(p.predictions.y, dtype=np.int64))
    per_point = (lp.argmax(1) == y).double() - lp.exp().max(1).values
    s = unc.settings
    resampled = resample_counts(len(y), s.resamples, s.seed) @ per_point / len(y)
    tail = (1 - s.level) / 2
    low, high = torch.quantile(resampled, torch.tensor([tail, 1 - tail], dtype=torch.float64))
    return float(per_point.mean()), float(low), float(high)


def confidence_text(p: PredictorResult, unc: Uncertainty) -> str:
    """Mean confidence and the accuracy - confidence gap; a side (over-, under-confident)
    only where the gap's interval excludes 0."""
    found = mean_confidence(p)
    if found is None:
        return f"{p.name}: no reliability bins"
    conf, acc = found
    text = f"{p.name} mean confidence {pct(conf)}, accuracy - confidence"
    gap = confidence_gap(p, unc)
    if gap is None:
        side = "under-confident" if acc > conf else "over-confident" if acc < conf else "even"
        return f"{text} {100 * (acc - conf):+.2f} pp ({side} on average; no interval)"
    point, low, high = gap
    side = "under-confident" if low > 0 else "over-confident" if high < 0 else "within noise of 0"
    shown = interval_text(100 * point, 100 * low, 100 * high, 2)
    return f"{text} {shown} pp ({side} on average)"


def accuracy_lower(point: SweepPoint, ours: str, theirs: str, n: int) -> float:
    """Lower end of the 95% interval of the accuracy difference ``ours - theirs`` at a W."""
    return accuracy_interval(point.metric(ours, "accuracy"), point.metric(theirs, "accuracy"), n)[0]
