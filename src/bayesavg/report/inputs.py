"""What the report is given: plain dataclasses the report stage fills from files."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PredictorResult:
    """Everything the report needs about one evaluated predictor."""

    name: str
    method: str
    trajectory: str
    scale: float
    metrics: dict[str, float]
    reliability: list[dict[str, float]]
    by_samples: list[dict[str, float]]

    def metric(self, key: str) -> float:
        """The metric as a float; NaN when missing, so comparisons can say so."""
        value = self.metrics.get(key)
        return float(value) if value is not None else math.nan


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
class ReportInputs:
    """All report content; ``predictors`` are listed in table order.

    ``histories`` may carry per-epoch test columns (test_loss, test_accuracy
    and, for averaging runs, avg_test_loss, avg_test_accuracy); ``planes``
    maps a trajectory to its loss plane. Figures without data are left out.
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
