"""Every interval the report shows, computed once from the per-point predictions.

A difference of one test image in 1,000 is not an improvement (ALGORITHMS
§10): each predictor's metrics get a percentile bootstrap interval over the
test points, and each comparison (every predictor against the baseline,
every counterpart against its reference) a paired bootstrap of the
difference and, for accuracy, McNemar's exact test. Any other pair (the
DSWAG roles, say) is compared on first request and kept. Predictors without
per-point predictions get no interval; the text then says so.

Several sections of one report need the same numbers, and a bootstrap is
the slow part of writing it: ``per_inputs`` computes such a result once per
``ReportInputs`` object.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch

from . import parallel
from .inputs import PredictorResult, ReportInputs
from .intervals import (
    PER_POINT,
    SELECTIVE,
    Estimate,
    Interval,
    bootstrap,
    carried_by,
    mcnemar,
    paired_bootstrap,
)

METRICS = ("accuracy", "nll", "ece", "brier", *SELECTIVE)
CALIBRATED = ("nll", "ece", "brier")  # at each predictor's own temperature
ECE_BINS = 20


@dataclass(frozen=True)
class Settings:
    """How the bootstrap resamples: ``report.bootstrap`` in params, else these defaults."""

    resamples: int = 2000
    seed: int = 0
    level: float = 0.95


def settings(params: dict[str, Any]) -> Settings:
    """The bootstrap settings from ``params['report']['bootstrap']`` where given."""
    report = params.get("report")
    found = report.get("bootstrap") if isinstance(report, dict) else None
    if not isinstance(found, dict):
        return Settings()
    default = Settings()
    return Settings(
        resamples=int(found.get("resamples", default.resamples)),
        seed=int(found.get("seed", default.seed)),
        level=float(found.get("level", default.level)),
    )


@dataclass(frozen=True)
class Comparison:
    """``candidate`` against ``reference`` on the same points: intervals of candidate -
    reference by metric, McNemar's exact p for accuracy, and how many test points the
    NLL difference rests on (``intervals.carried_by``)."""

    reference: str
    candidate: str
    intervals: dict[str, Interval]
    mcnemar_p: float
    nll_carried_by: int | None = None


@dataclass(frozen=True)
class Uncertainty:
    """Estimates by predictor and metric; comparisons by (reference, candidate).

    ``predictors`` by name lets ``comparison`` compare a pair that ``compute``
    did not; ``requested`` keeps those, so each is bootstrapped once.
    """

    settings: Settings
    estimates: dict[str, dict[str, Estimate]] = field(default_factory=dict)
    comparisons: dict[tuple[str, str], Comparison] = field(default_factory=dict)
    calibrated: dict[str, dict[str, Estimate]] = field(default_factory=dict)
    calibrated_vs_baseline: dict[str, Interval] = field(default_factory=dict)
    predictors: dict[str, PredictorResult] = field(default_factory=dict, repr=False, compare=False)
    requested: dict[tuple[str, str], Comparison | None] = field(
        default_factory=dict, repr=False, compare=False
    )
    extra: dict[tuple[str, str, str], Interval | None] = field(
        default_factory=dict, repr=False, compare=False
    )

    def estimate(self, name: str, metric: str) -> Estimate | None:
        return self.estimates.get(name, {}).get(metric)

    def comparison(self, reference: str, candidate: str) -> Comparison | None:
        """The paired comparison of two distinct predictors; None without predictions."""
        key = (reference, candidate)
        if key in self.comparisons:
            return self.comparisons[key]
        if key not in self.requested:
            ref, cand = self.predictors.get(reference), self.predictors.get(candidate)
            found = None
            if ref is not None and cand is not None and reference != candidate:
                found = compare(ref, cand, self.settings)
            self.requested[key] = found
        return self.requested[key]

    def paired(self, reference: str, candidate: str, metric: str) -> Interval | None:
        """The paired interval of a metric no comparison computes (``confidence``), on
        request and once; None without predictions on the same labels."""
        key = (reference, candidate, metric)
        if key not in self.extra:
            ref, cand = self.predictors.get(reference), self.predictors.get(candidate)
            a = _tensors(ref) if ref is not None else None
            b = _tensors(cand) if cand is not None else None
            found = None
            if a is not None and b is not None and _same_points(a, b):
                s = self.settings
                found = paired_bootstrap(metric, a[0], b[0], a[1], s.resamples, s.seed, s.level)
            self.extra[key] = found
        return self.extra[key]


def _same_points(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]
) -> bool:
    return a[0].shape == b[0].shape and torch.equal(a[1], b[1])


def _tensors(p: PredictorResult) -> tuple[torch.Tensor, torch.Tensor] | None:
    if p.predictions is None:
        return None
    return (
        torch.as_tensor(np.asarray(p.predictions.log_probs, dtype=np.float64)),
        torch.as_tensor(np.asarray(p.predictions.y, dtype=np.int64)),
    )


def temperature_of(p: PredictorResult) -> float | None:
    """The T fitted on validation for the calibrated metrics (``metrics.calibrated``)."""
    found = p.metrics.get("calibrated")
    t = found.get("temperature") if isinstance(found, dict) else None
    return float(t) if isinstance(t, int | float) else None


def tempered(p: PredictorResult) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The predictor's test log-probabilities at its own temperature, and the labels."""
    found, t = _tensors(p), temperature_of(p)
    if found is None or t is None:
        return None
    return torch.log_softmax(found[0] / t, dim=1), found[1]


def calibrated_estimates(p: PredictorResult, s: Settings) -> dict[str, Estimate]:
    """The calibrated metrics with intervals (the temperature held fixed: it was fitted on
    validation, not on the test points resampled here)."""
    found = tempered(p)
    if found is None:
        return {}
    lp, y = found
    return {m: bootstrap(m, lp, y, s.resamples, s.seed, s.level, ECE_BINS) for m in CALIBRATED}


def calibrated_comparison(
    base: PredictorResult, p: PredictorResult, s: Settings
) -> Interval | None:
    """``p``'s calibrated NLL against the calibrated baseline's, paired; None unless both
    have a temperature and predictions on the same labels."""
    ref, cand = tempered(base), tempered(p)
    if ref is None or cand is None or cand[0].shape != ref[0].shape:
        return None
    if not torch.equal(cand[1], ref[1]):
        return None
    return paired_bootstrap("nll", ref[0], cand[0], ref[1], s.resamples, s.seed, s.level, ECE_BINS)


def estimates(p: PredictorResult, s: Settings) -> dict[str, Estimate]:
    """The predictor's metrics with intervals; empty without predictions."""
    found = _tensors(p)
    if found is None:
        return {}
    lp, y = found
    return {m: bootstrap(m, lp, y, s.resamples, s.seed, s.level, ECE_BINS) for m in METRICS}


def compare(ref: PredictorResult, cand: PredictorResult, s: Settings) -> Comparison | None:
    """The paired comparison; None unless both have predictions on the same labels."""
    a, b = _tensors(ref), _tensors(cand)
    if a is None or b is None or not _same_points(a, b):
        return None
    y = a[1]
    intervals = {
        m: paired_bootstrap(m, a[0], b[0], y, s.resamples, s.seed, s.level, ECE_BINS)
        for m in METRICS
    }
    p = mcnemar(a[0].argmax(1) == y, b[0].argmax(1) == y)
    carried = carried_by(PER_POINT["nll"](b[0], y) - PER_POINT["nll"](a[0], y))
    return Comparison(ref.name, cand.name, intervals, p, carried)


def compared_pairs(inputs: ReportInputs) -> list[tuple[PredictorResult, PredictorResult]]:
    """(reference, candidate): each predictor against the baseline, then the given pairs."""
    by_name = {p.name: p for p in inputs.predictors}
    base = by_name.get(inputs.baseline)
    found = [(base, p) for p in inputs.predictors if base is not None and p is not base]
    found += [
        (by_name[r], by_name[c])
        for r, c in inputs.pairs
        if r in by_name and c in by_name and r != c and r != inputs.baseline
    ]
    return found


T = TypeVar("T")


def per_inputs(build: Callable[[ReportInputs], T]) -> Callable[[ReportInputs], T]:
    """``build`` computed once per ``ReportInputs`` object and kept while it lives.

    The inputs hold lists and dicts, so they cannot be a cache key themselves:
    the key is their id, and an entry goes when its inputs are collected, so a
    later object that gets the same id is never handed a stale result.
    """
    cache: dict[int, tuple[weakref.ref[ReportInputs], T]] = {}

    def forget(ref: weakref.ref[ReportInputs], key: int) -> None:
        if key in cache and cache[key][0] is ref:
            del cache[key]

    @functools.wraps(build)
    def cached(inputs: ReportInputs) -> T:
        key = id(inputs)
        found = cache.get(key)
        if found is not None and found[0]() is inputs:
            return found[1]
        result = build(inputs)
        cache[key] = (weakref.ref(inputs, functools.partial(forget, key=key)), result)
        return result

    return cached


@per_inputs
def compute(inputs: ReportInputs) -> Uncertainty:
    """Every estimate and comparison the report shows, with the params' settings; once
    per inputs, as the headline, the Distributed SWAG section and the tables share it.
    Each predictor's intervals and each comparison is a job of its own, on every usable
    core (``parallel``)."""
    s = settings(inputs.params)
    by_name = {p.name: p for p in inputs.predictors}
    base = by_name.get(inputs.baseline)
    pairs = compared_pairs(inputs)
    calibrated_vs = [p for p in inputs.predictors if base is not None and p is not base]
    jobs: list[Callable[[], Any]] = [
        *(functools.partial(estimates, p, s) for p in inputs.predictors),
        *(functools.partial(compare, r, c, s) for r, c in pairs),
        *(functools.partial(calibrated_estimates, p, s) for p in inputs.predictors),
        *(functools.partial(calibrated_comparison, base, p, s) for p in calibrated_vs),
    ]
    done = iter(parallel.fork_map(_run, jobs))
    found = {p.name: e for p in inputs.predictors if (e := next(done))}
    comparisons = {(r.name, c.name): comp for r, c in pairs if (comp := next(done)) is not None}
    calibrated = {p.name: e for p in inputs.predictors if (e := next(done))}
    vs_baseline = {p.name: i for p in calibrated_vs if (i := next(done)) is not None}
    return Uncertainty(s, found, comparisons, calibrated, vs_baseline, by_name)


def _run(job: Callable[[], T]) -> T:
    return job()
