"""Setup: what data, which predictors, against what baseline."""

from __future__ import annotations

import math
from typing import Any

from ...config.methods import REGISTRY
from ..blocks import (
    Heading,
    Paragraph,
    Section,
)
from ..inputs import ReportInputs
from ..uncertainty import Uncertainty


def _kl_weight(params: dict[str, Any], trajectory: str) -> float:
    """The trajectory's VI KL weight from the raw params (1.0 where there is none)."""
    traj = params.get("finetune", {}).get(trajectory, {})
    vi = traj.get("vi") if isinstance(traj, dict) else None
    return float(vi.get("kl_weight", 1.0)) if isinstance(vi, dict) else 1.0


def intervals_line(unc: Uncertainty) -> str:
    """Which intervals the report gives, as ALGORITHMS §10 asks the setup line to say."""
    s = unc.settings
    return (
        f" Intervals: {100 * s.level:g}% bootstrap over the test points ({s.resamples} "
        f"resamples, seed {s.seed}); percentile intervals, except a predictor's own ECE, "
        "whose percentile interval is shifted by the resamples' median bias (a "
        "bias-corrected interval: binned ECE's bootstrap sits above its point). Differences "
        "between two predictors are paired (the same resamples for both), percentile, and "
        "decided one comparison at a time; the headline also counts them Holm-corrected."
    )


def summary(inputs: ReportInputs) -> str:
    """One paragraph: what data, which predictors, against what baseline."""
    info = dict(inputs.dataset_summary)
    name = info.pop("dataset", None)
    details = ", ".join(f"{k}={v}" for k, v in info.items())
    data = f"Dataset {name}" if name is not None else "Dataset"
    data = f"{data} ({details})." if details else f"{data}: no summary given."
    described = []
    for p in inputs.predictors:
        what = REGISTRY[p.method].label if p.method in REGISTRY else f"method {p.method}"
        extra = f", scale {p.scale:g}" if p.scale else ""
        temperature = p.metric("temperature")
        if math.isfinite(temperature):
            extra += f", temperature-scaled: T = {temperature:.3g} fitted on val"
        kl_weight = _kl_weight(inputs.params, p.trajectory)
        if kl_weight != 1.0:
            extra += f", tempered: KL weight {kl_weight:g}, not the true ELBO"
        described.append(f"{p.name} ({what}, trajectory {p.trajectory}{extra})")
    test = info.get("test")
    seed = inputs.params.get("seed")
    seeds = [r.seed for r in inputs.seeds]
    over = (
        f" Over seeds: mean ± std of {len(seeds)} seeds ({', '.join(map(str, seeds))}), each "
        "comparison also decided in every seed's paired test (section 'Results over seeds')."
        if len(seeds) > 1
        else " One seed: set seeds: [0, 1, 2] for mean ± std over reruns (README)."
    )
    basis = (
        f" Every interval rests on the {test} test points of one training seed (seed {seed}): "
        "it measures how the metric varies over test points, not over reruns." + over
        if test is not None and seed is not None
        else ""
    )
    return (
        f"{data} Predictors: {'; '.join(described) or 'none'}. "
        f"Each is compared with the baseline {inputs.baseline}; "
        "lower is better for NLL, ECE and Brier, higher for accuracy." + basis
    )


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    return Section([Heading(2, "Setup"), Paragraph(summary(inputs) + intervals_line(unc))])
