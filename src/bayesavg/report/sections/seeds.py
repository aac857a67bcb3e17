"""Results over seeds: every predictor's test metrics as mean ± std over ``seeds``, and
the NLL comparisons the papers make decided in each seed's own paired test.

The intervals elsewhere in the report rest on the test points of the pipeline's
own seed; training noise (initialisation, batch order, sampling) is what the
seeds add. A claim holds across seeds only where it holds in every seed's paired
bootstrap over the test points (the data split is the same at every seed).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..blocks import Cell, Heading, Paragraph, Section, Table, TableBlock, claim_bullets
from ..claims import BMA_PAPER, MULTISWAG_PAPER, Claim
from ..formats import LABELS, interval_text, metric_scale, with_interval
from ..inputs import ReportInputs, SeedRun
from ..intervals import Interval, paired_bootstrap
from ..uncertainty import Uncertainty

# (paper, candidate, reference): the NLL comparisons checked in every seed.
PAIRS = (
    (MULTISWAG_PAPER, "multiswag", "ensemble"),
    (BMA_PAPER, "swag", "map"),
    (BMA_PAPER, "swag", "map_ts"),
    (BMA_PAPER, "swag", "laplace"),
)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1); std 0 for one value."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def _log_probs(inputs: ReportInputs, run: SeedRun, name: str) -> torch.Tensor | None:
    """Predictor ``name``'s test log-probabilities at the seed of ``run``."""
    if name in run.log_probs:
        return torch.from_numpy(np.asarray(run.log_probs[name]))
    own = next((p for p in inputs.predictors if p.name == name), None)
    seed = inputs.params.get("seed")
    if run.seed == seed and own is not None and own.predictions is not None:
        return torch.from_numpy(np.asarray(own.predictions.log_probs))
    return None


def _labels(inputs: ReportInputs, run: SeedRun) -> torch.Tensor | None:
    if run.y is not None:
        return torch.from_numpy(np.asarray(run.y)).long()
    own = next((p for p in inputs.predictors if p.predictions is not None), None)
    return None if own is None else torch.from_numpy(np.asarray(own.predictions.y)).long()


def per_seed(
    inputs: ReportInputs, unc: Uncertainty, ref: str, cand: str, metric: str = "nll"
) -> list[Interval | None]:
    """Each seed's paired bootstrap of metric(cand) - metric(ref) over the test points."""
    s = unc.settings
    found: list[Interval | None] = []
    for run in inputs.seeds:
        a, b, y = _log_probs(inputs, run, ref), _log_probs(inputs, run, cand), _labels(inputs, run)
        ok = a is not None and b is not None and y is not None and a.shape == b.shape
        found.append(paired_bootstrap(metric, a, b, y, s.resamples, s.seed) if ok else None)
    return found


def seeds_claim(
    inputs: ReportInputs, unc: Uncertainty, paper: str, cand: str, ref: str
) -> Claim | None:
    """Holds when cand's NLL is below ref's beyond noise in every seed; fails when it is
    above in any; undecided otherwise."""
    if not all(cand in r.metrics and ref in r.metrics for r in inputs.seeds):
        return None
    statement = f"{cand} beats {ref} on NLL in every seed"
    tests = per_seed(inputs, unc, ref, cand)
    n = len(tests)
    diffs = [r.metrics[cand]["nll"] - r.metrics[ref]["nll"] for r in inputs.seeds]
    mean, std = mean_std(diffs)
    if any(t is None for t in tests):
        number = f"NLL diff {mean:+.4f} ± {std:.4f} over {n} seeds, no per-seed test"
        return Claim(paper, statement, None, number + ".", number)
    verdicts = [t.verdict() for t in tests if t is not None]
    better, worse = verdicts.count("better"), verdicts.count("worse")
    holds = True if better == n else False if worse else None
    number = f"better in {better} of {n} seeds; NLL diff {mean:+.4f} ± {std:.4f}"
    detail = "; ".join(
        f"seed {r.seed}: {interval_text(t.diff, t.low, t.high)}"
        for r, t in zip(inputs.seeds, tests, strict=True)
        if t is not None
    )
    evidence = (
        f"Each seed's paired bootstrap of NLL({cand}) - NLL({ref}) over the test points: "
        f"{detail}; worse in {worse}."
    )
    return Claim(paper, statement, holds, evidence, number)


def table(inputs: ReportInputs, unc: Uncertainty) -> Table:
    """Predictor by metric: mean ± std over the seeds (n - 1 in the std), beside the
    pipeline seed's value with its interval over the test points."""
    names = [p.name for p in inputs.predictors if all(p.name in r.metrics for r in inputs.seeds)]
    own = inputs.params.get("seed")
    rows = []
    for name in names:
        cells = [Cell(name)]
        for key in LABELS:
            values = [r.metrics[name].get(key, math.nan) for r in inputs.seeds]
            scale, digits, unit = metric_scale(key)
            mean, std = mean_std([scale * v for v in values])
            cells.append(Cell(f"{mean:.{digits}f} ± {std:.{digits}f}{unit}"))
            point = next((r.metrics[name].get(key) for r in inputs.seeds if r.seed == own), None)
            found = unc.estimate(name, key)
            cells.append(Cell(with_interval(key, point, found) if point is not None else "n/a"))
        rows.append(cells)
    header = ["Predictor"]
    for label in LABELS.values():
        header += [f"{label} mean ± std", f"{label} seed {own} [95% CI]"]
    return Table(header, rows)


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    seeds = [r.seed for r in inputs.seeds]
    if len(seeds) < 2:
        return Section([])
    found = [
        c
        for paper, cand, ref in PAIRS
        if (c := seeds_claim(inputs, unc, paper, cand, ref)) is not None
    ]
    note = (
        f"Every trajectory and predictor rerun at seeds {', '.join(map(str, seeds))} "
        "(initialisation, batch order and sampling change; the data split does not): each "
        f"test metric as mean ± standard deviation over the {len(seeds)} seeds, beside the "
        "pipeline seed's value with its 95% interval over the test points. A comparison "
        "holds across seeds only where each seed's own paired bootstrap over the test points "
        "finds it beyond noise."
    )
    return Section(
        [
            Heading(2, f"Results over {len(seeds)} seeds"),
            Paragraph(note),
            TableBlock(table(inputs, unc)),
            claim_bullets(found),
        ],
        found,
    )
