"""What the report is given: plain dataclasses the report stage fills from files."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

# Quantiles of the per-weight ratio sigma / sigma_0 a variational predictor reports.
SIGMA_KEYS = ("min", "p01", "p10", "p25", "median", "p75", "p90", "p99", "max", "mean")


@dataclass(frozen=True)
class PredictorResult:
    """Everything the report needs about one evaluated predictor.

    ``metrics`` holds floats by name; a variational predictor also holds
    ``sigma_ratio``, the quantiles (``SIGMA_KEYS``) of sigma / sigma_0 over
    its weights.
    """

    name: str
    method: str
    trajectory: str
    scale: float
    metrics: dict[str, Any]
    reliability: list[dict[str, float]]
    by_samples: list[dict[str, float]]

    def metric(self, key: str) -> float:
        """The metric as a float; NaN when missing, so comparisons can say so."""
        value = self.metrics.get(key)
        return float(value) if value is not None else math.nan

    @property
    def sigma_ratio(self) -> dict[str, float] | None:
        """The sigma / sigma_0 quantiles, or None unless all are there and positive.

        They are drawn on a log axis, where a zero, negative or missing value
        has no place; such a predictor is left out rather than half drawn.
        """
        stats = self.metrics.get("sigma_ratio")
        if not isinstance(stats, dict):
            return None
        values = {k: stats.get(k) for k in SIGMA_KEYS}
        if not all(isinstance(v, Real) and 0 < v < math.inf for v in values.values()):
            return None
        return {k: float(v) for k, v in values.items()}


@dataclass(frozen=True)
class PlaneData:
    """One trajectory's loss plane, as the plane stage writes it (see ``bayesavg.plane``).

    ``grid`` rows: a, b, loss, accuracy. ``path`` rows: kind (snapshot,
    average, start), index, a, b, distance, loss, accuracy. ``summary``:
    at least explained_variance_ratio (two shares); start, n_points,
    n_snapshots, n_collected when known.
    """

    grid: list[dict[str, float]]
    path: list[dict[str, Any]]
    summary: dict[str, Any]


@dataclass(frozen=True)
class SweepPoint:
    """One run of the DSWAG worker sweep (stage ``dswag_sweep@<W>``, see ``bayesavg.sweep``).

    ``metrics`` maps fedavg, dswa and dswag to their test accuracy, nll, ece
    and brier; an entry is None where it could not be evaluated (DSWAG with
    fewer than 2 snapshots has no variance). ``history``: one row per phase-1
    round (epoch = round, train_accuracy, test_accuracy, ...).
    ``sigma_distance``: rows of multiple, draw, accuracy, nll, sigma_norm.
    """

    workers: int
    rounds: int
    rounds_to_target: int | None
    target_accuracy: float
    snapshots: int
    metrics: dict[str, dict[str, float] | None]
    history: list[dict[str, float]]
    sigma_distance: list[dict[str, float]]

    def metric(self, predictor: str, key: str) -> float:
        """The metric as a float; NaN when the predictor or the key is missing."""
        values = self.metrics.get(predictor)
        value = values.get(key) if isinstance(values, dict) else None
        return float(value) if isinstance(value, Real) else math.nan


@dataclass(frozen=True)
class ReportInputs:
    """All report content; ``predictors`` are listed in table order.

    ``histories`` may carry per-epoch test columns (test_loss, test_accuracy
    and, for averaging runs, avg_test_loss, avg_test_accuracy); ``planes``
    maps a trajectory to its loss plane; ``dswag_sweep`` holds the DSWAG
    worker sweep, one point per number of workers W (in increasing W).
    Figures without data are left out.
    """

    title: str
    predictors: list[PredictorResult]
    histories: dict[str, list[dict[str, float]]]
    params: dict[str, Any]
    run_ids: dict[str, str]
    baseline: str = "map"
    notes: str = ""
    dataset_summary: dict[str, Any] = field(default_factory=dict)
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (reference, candidate)
    planes: dict[str, PlaneData] = field(default_factory=dict)
    dswag_sweep: list[SweepPoint] = field(default_factory=list)


def trajectory_params(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Trajectory sections of the raw params (``finetune.<name>``) that are mappings."""
    finetune = params.get("finetune", {})
    return (
        {k: v for k, v in finetune.items() if isinstance(v, dict)}
        if isinstance(finetune, dict)
        else {}
    )
