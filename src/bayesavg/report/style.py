"""One look for every figure: predictor families, a colour per predictor, F-variants dashed.

Figures are small multiples by family (SWA/SWAG, VI/HWA, dropout, ensembles,
SGLD, distributed), each predictor beside its flat-seeking (SAM) variant. A
predictor keeps its colour in every figure; its F-variant shares the hue and
is drawn dashed, so a pair reads as a pair. The baseline is drawn in every
panel, grey, as the common reference.
"""

from __future__ import annotations

from typing import Any

import matplotlib

from .inputs import PredictorResult, ReportInputs, trajectory_params

# Family of a method, in panel order; methods not listed go to "other".
FAMILIES: dict[str, tuple[str, ...]] = {
    "SWA / SWAG": ("swa", "swag_diag", "swag"),
    "VI / HWA": ("vi", "hwa", "hwa_mf", "hwa_rho"),
    "MC dropout": ("mc_dropout",),
    "Ensembles": ("ensemble",),
    "SGLD": ("sgld",),
}
DISTRIBUTED = "Distributed (DSWAG)"
OTHER = "Other"
BASELINE_COLOUR = "0.35"
_PALETTE = matplotlib.colormaps["tab10"].colors


def is_flat_seeking(p: PredictorResult, inputs: ReportInputs) -> bool:
    """Whether the predictor's trajectory uses SAM gradients (an F-variant)."""
    traj = trajectory_params(inputs.params).get(p.trajectory, {})
    return float(traj.get("sam_rho") or 0.0) > 0.0


def _distributed_trajectories(inputs: ReportInputs) -> set[str]:
    """dswag trajectories and those that start from one (fedavg_swag)."""
    trajs = trajectory_params(inputs.params)
    found = {name for name, t in trajs.items() if t.get("kind") == "dswag"}
    grew = True
    while grew:
        more = {name for name, t in trajs.items() if t.get("start") in found} - found
        found |= more
        grew = bool(more)
    return found


def family(p: PredictorResult, inputs: ReportInputs) -> str | None:
    """The family panel the predictor is drawn in; None for the baseline (in every panel)."""
    if p.name == inputs.baseline:
        return None
    if p.trajectory in _distributed_trajectories(inputs):
        return DISTRIBUTED
    for title, methods in FAMILIES.items():
        if p.method in methods:
            return title
    return OTHER


def families(inputs: ReportInputs) -> dict[str, list[PredictorResult]]:
    """Family title -> its predictors (table order), families in a fixed order, empty ones
    left out; the baseline is in none (draw it in each)."""
    order = [*FAMILIES, DISTRIBUTED, OTHER]
    out: dict[str, list[PredictorResult]] = {title: [] for title in order}
    for p in inputs.predictors:
        title = family(p, inputs)
        if title is not None:
            out[title].append(p)
    return {title: ps for title, ps in out.items() if ps}


def baseline(inputs: ReportInputs) -> PredictorResult | None:
    return next((p for p in inputs.predictors if p.name == inputs.baseline), None)


def colours(inputs: ReportInputs) -> dict[str, Any]:
    """A colour per predictor name, the same in every figure.

    Within a family the non-flat predictors take tab10 colours in order; each
    F-variant takes its reference's colour (``inputs.pairs``), else the next one.
    The baseline is grey.
    """
    pairs = dict((c, r) for r, c in inputs.pairs)
    out: dict[str, Any] = {inputs.baseline: BASELINE_COLOUR}
    for members in families(inputs).values():
        i = 0
        for p in members:
            ref = pairs.get(p.name)
            if is_flat_seeking(p, inputs) and ref in out and ref != inputs.baseline:
                out[p.name] = out[ref]
                continue
            out[p.name] = _PALETTE[i % len(_PALETTE)]
            i += 1
    return out


def linestyle(p: PredictorResult, inputs: ReportInputs) -> str:
    """Dashed for flat-seeking variants, dotted for the baseline, solid otherwise."""
    if p.name == inputs.baseline:
        return ":"
    return "--" if is_flat_seeking(p, inputs) else "-"
