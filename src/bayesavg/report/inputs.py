"""What the report is given: plain dataclasses the report stage fills from files."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from ..config.methods import REGISTRY

# Quantiles of the per-weight ratio sigma / sigma_0 a variational predictor reports.
SIGMA_KEYS = ("min", "p01", "p10", "p25", "median", "p75", "p90", "p99", "max", "mean")


@dataclass(frozen=True)
class Predictions:
    """One predictor's per-point predictions (``predictions/<trajectory>/<name>.npz``).

    ``log_probs``: the BMA's log-probabilities on the clean test split (n x C),
    ``y`` its labels: what paired bootstraps between predictors resample.
    ``shift_log_probs`` maps a shift name (``rotate_15``, ``shot_noise``) to the
    BMA log-probabilities on the shifted test subset whose labels are
    ``shift_y`` (the same subset for every shift and predictor).
    ``ood_scores`` maps ``"test"`` (the in-distribution reference) and each OOD
    set to its per-point scores by name (``msp``, ``entropy``, ``mutual_info``;
    higher = more OOD, so ``msp`` holds 1 - the maximum probability).
    """

    y: np.ndarray
    log_probs: np.ndarray
    shift_y: np.ndarray | None = None
    shift_log_probs: dict[str, np.ndarray] = field(default_factory=dict)
    ood_scores: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True)
class PredictorResult:
    """Everything the report needs about one evaluated predictor.

    ``metrics`` holds floats by name; a variational predictor also holds
    ``sigma_ratio``, the quantiles (``SIGMA_KEYS``) of sigma / sigma_0 over
    its weights. ``metrics["shift"]`` maps a shift name to its accuracy, nll,
    ece, brier and entropy; ``metrics["ood"]`` maps an OOD set to score to its
    auroc, aupr_in, aupr_out and fpr95 (OOD the positive class).
    """

    name: str
    method: str
    trajectory: str
    scale: float
    metrics: dict[str, Any]
    reliability: list[dict[str, float]]
    by_samples: list[dict[str, float]]
    predictions: Predictions | None = None

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
    """One trajectory's loss plane, as stage landscape writes it (``bayesavg.analyses.plane``).

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
    """One run of the DSWAG worker sweep (W clients, a run of stage ``dswag_sweep``, see
    ``bayesavg.analyses.sweep``).

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
class LineData:
    """A line between two posteriors' centres (probe ``line@<name>`` of stage ``landscape``,
    ``bayesavg.analyses.landscape``).

    ``a``/``b``: the trajectories; ``a_centre``/``b_centre``: which centre of each
    (``weights``, ``snapshot_mean``, ``hwa_mean``, ...). ``rows``: t,
    train_loss (data term), weight_decay_term, train_error, test_error,
    test_nll, at w(t) = w_a + t (w_b - w_a).
    """

    a: str
    b: str
    a_centre: str
    b_centre: str
    rows: list[dict[str, float]]


@dataclass(frozen=True)
class RayData:
    """Random rays from one trajectory's centre (probe ``rays@<trajectory>`` of stage
    ``landscape``).

    ``rows``: direction, distance, train_loss, weight_decay_term, train_error,
    test_error, test_nll. ``widths``: per direction, the distance at which the
    train loss first exceeds its value at 0 by ``delta`` (None: not within the
    grid). The directions are the same seeded ones for every centre.
    """

    trajectory: str
    centre: str
    rows: list[dict[str, float]]
    widths: list[float | None]
    delta: float
    filter_normalised: bool


@dataclass(frozen=True)
class SwagDirections:
    """A SWAG-kind posterior's own directions (probe ``swag_directions@<trajectory>`` of stage
    ``landscape``).

    ``directions`` rows: direction (0-based, by decreasing variance), sigma (the
    standard deviation along it), offset (in multiples of sigma), distance,
    train_loss, weight_decay_term, train_error, test_error, test_nll.
    ``sigma_distance`` rows: multiple, draw, accuracy, nll, sigma_norm (test
    accuracy of theta_bar + m sigma * z, the same format as ``SweepPoint``).
    """

    trajectory: str
    directions: list[dict[str, float]]
    sigma_distance: list[dict[str, float]]


@dataclass(frozen=True)
class Landscape:
    """Every landscape analysis the pipeline ran; maps keyed by line name or trajectory."""

    lines: dict[str, LineData] = field(default_factory=dict)
    rays: dict[str, RayData] = field(default_factory=dict)
    swag: dict[str, SwagDirections] = field(default_factory=dict)


@dataclass(frozen=True)
class SeedRun:
    """The pipeline at one seed of ``seeds``: each predictor's test metrics and, for seeds
    other than the pipeline's own (whose are the predictors' ``predictions``), the
    per-point test log-probabilities by predictor and the labels."""

    seed: int
    metrics: dict[str, dict[str, float]]
    log_probs: dict[str, Any] = field(default_factory=dict)
    y: Any = None


@dataclass(frozen=True)
class ReportInputs:
    """All report content; ``predictors`` are listed in table order.

    ``histories`` may carry per-epoch test columns (test_loss, test_accuracy
    and, for averaging runs, avg_test_loss, avg_test_accuracy); ``planes``
    maps a trajectory to its loss plane; ``dswag_sweep`` holds the DSWAG
    worker sweep, one point per number of workers W (in increasing W).
    Figures without data are left out. Nothing here changes from one execution
    to the next (no run ids, no timings): the report is a DVC output whose bytes
    a rerun on any machine reproduces.
    """

    title: str
    predictors: list[PredictorResult]
    histories: dict[str, list[dict[str, float]]]
    params: dict[str, Any]
    runs: list[str]  # the pipeline's MLflow run names (a stage's, or a unit's of a stage)
    baseline: str = "map"
    notes: str = ""
    dataset_summary: dict[str, Any] = field(default_factory=dict)
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (reference, candidate)
    planes: dict[str, PlaneData] = field(default_factory=dict)
    dswag_sweep: list[SweepPoint] = field(default_factory=list)
    landscape: Landscape | None = None
    seeds: list[SeedRun] = field(default_factory=list)  # every seed of ``seeds``, in order


def trajectory_params(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Trajectory sections of the raw params (``finetune.<name>``) that are mappings."""
    finetune = params.get("finetune", {})
    return (
        {k: v for k, v in finetune.items() if isinstance(v, dict)}
        if isinstance(finetune, dict)
        else {}
    )


def is_bayesian(p: PredictorResult) -> bool:
    """Whether the predictor averages over a posterior: several networks, or in closed form
    (the Laplace probit). Single networks are not, and have MI = 0."""
    method = REGISTRY.get(p.method)
    return method is None or method.samples != "one" or method.closed_form


def is_closed_form(p: PredictorResult) -> bool:
    """A posterior predictive from one pass: no samples, so its MI is 0 by construction."""
    method = REGISTRY.get(p.method)
    return method is not None and method.closed_form
