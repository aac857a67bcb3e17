"""One look for every figure, and the drawing helpers every section shares.

Predictor families, a colour per predictor, F-variants dashed.

Figures are small multiples by family (SWA/SWAG, VI/HWA, dropout, ensembles,
SGLD, distributed), each predictor beside its flat-seeking (SAM) variant. A
predictor keeps its colour in every figure; its F-variant shares the hue and
is drawn dashed, so a pair reads as a pair. The baseline is drawn in every
panel, grey, as the common reference.
"""

from __future__ import annotations

import io
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from .inputs import PredictorResult, ReportInputs, is_bayesian, trajectory_params

# Family of a method, in panel order; methods not listed go to "other".
FAMILIES: dict[str, tuple[str, ...]] = {
    "SWA / SWAG": ("swa", "swag_diag", "swag"),
    "VI / HWA": ("vi", "hwa", "hwa_mf", "hwa_rho"),
    "MC dropout": ("mc_dropout",),
    "Ensembles": ("ensemble", "multiswa", "multiswag"),
    "Laplace": ("laplace", "laplace_mc"),
    "SGLD": ("sgld",),
}
DISTRIBUTED = "Distributed (DSWAG)"
OTHER = "Other"
BASELINE_COLOUR = "0.35"
TAB10 = matplotlib.colormaps["tab10"].colors


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
            out[p.name] = TAB10[i % len(TAB10)]
            i += 1
    return out


def linestyle(p: PredictorResult, inputs: ReportInputs) -> str:
    """Dashed for flat-seeking variants, dotted for the baseline, solid otherwise."""
    if p.name == inputs.baseline:
        return ":"
    return "--" if is_flat_seeking(p, inputs) else "-"


def line_style(p: PredictorResult, inputs: ReportInputs, colours: dict[str, Any]) -> dict:
    """The predictor's colour and line style, as in every figure."""
    return {"color": colours.get(p.name, "k"), "linestyle": linestyle(p, inputs)}


def family_members(inputs: ReportInputs) -> list[tuple[str, list[PredictorResult]]]:
    """Each family's panel members, the baseline first (grey, dotted) in every one."""
    base = baseline(inputs)
    lead = [base] if base is not None else []
    return [(title, lead + members) for title, members in families(inputs).items()]


def png(fig: Figure) -> bytes:
    """PNG bytes without software metadata: identical figures give identical bytes.

    Figures are bare ``Figure`` objects (no pyplot, hence no global backend or
    figure state); Agg renders them.
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def png_or_none(fig: Figure | None) -> bytes | None:
    """``png`` of a figure builder's result, which is None when there is no data."""
    return png(fig) if fig is not None else None


def grid(rows: int, cols: int, width: float, height: float) -> tuple[Figure, np.ndarray]:
    """A constrained-layout figure ``width`` wide with ``rows`` rows of ``height``."""
    fig = Figure(figsize=(width, 0.5 + height * rows), layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False)


def series_axes(
    fig: Figure, rows: int, cols: int, width: float = 3.3, height: float = 2.4
) -> np.ndarray:
    """A grid of axes on a constrained-layout figure sized for readable panels."""
    fig.set_size_inches(min(width * cols + 2.5, 18), height * rows + 0.8)
    return fig.subplots(rows, cols, squeeze=False)


def row_legend(ax: Any, title: str | None = None, framed: bool = True) -> None:
    """The panel's legend right of its axes, outside them; constrained layout makes room.

    ``framed=False``: no frame and matplotlib's padding, as the analyses draw it.
    """
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    kw: dict[str, Any] = (
        {"borderaxespad": 0.0, "title": title, "title_fontsize": "small"}
        if framed
        else {"frameon": False}
    )
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", **kw)


def symlog_axis(ax: Any, ticks: list[float], linthresh: float) -> None:
    """A symlog x axis: 0 and the linear part first, then decades; ticks at ``ticks``."""
    ax.set_xscale("symlog", linthresh=linthresh, linscale=0.5)
    ax.set_xticks(ticks)
    ax.set_xlim(left=-0.3 * linthresh)  # nothing lies left of 0: no empty negative half
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


# The predictors the papers compare, drawn when present; otherwise one per family.
MAIN_PREDICTORS = (
    "swa",
    "swag",
    "multiswag",
    "ensemble",
    "laplace",
    "mc_dropout",
    "vi",
    "hwa",
    "sgld",
)


def main_predictors(inputs: ReportInputs) -> list[PredictorResult]:
    """The baseline and the main predictors with predictions (``MAIN_PREDICTORS``); without any of
    those, the first predictor of each family, an averaging (Bayesian) one first."""
    base = baseline(inputs)
    chosen = [base] if base is not None and base.predictions is not None else []
    by_name = {p.name: p for p in inputs.predictors if p.predictions is not None}
    main = [by_name[n] for n in MAIN_PREDICTORS if n in by_name and n != inputs.baseline]
    if main:
        return chosen + main
    for members in families(inputs).values():
        ranked = sorted(members, key=lambda p: not is_bayesian(p))
        first = next((p for p in ranked if p.predictions is not None), None)
        if first is not None:
            chosen.append(first)
    return chosen
