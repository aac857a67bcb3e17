"""Variational posteriors: how far each weight's sigma moved from its initial sigma_0."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from .. import style
from ..blocks import (
    Cell,
    Section,
    Table,
    figure_section,
)
from ..inputs import PredictorResult, ReportInputs
from ..uncertainty import Uncertainty


def _plain_log_ticks(axis: Any, span: float) -> None:
    """Ticks a reader can read off a log axis: plain numbers, enough of them.

    Within a factor 3 the log axis is nearly linear, so linear steps suit;
    up to four decades 1-2-5 steps; beyond that, decades only.
    """
    if span <= 3:
        axis.set_major_locator(MaxNLocator(nbins=6))
    elif span <= 1e4:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def sigma_figure(predictors: list[PredictorResult]) -> bytes | None:
    """One box per variational predictor from its precomputed sigma / sigma_0 quantiles.

    The per-weight ratios themselves never reach the report, so ``bxp``
    draws the quantiles directly: box p25-p75, median line, whiskers
    p01-p99, min and max as triangles, the mean as a diamond. None
    when no predictor reports the ratio.
    """
    ratios = [(p.name, r) for p in predictors if (r := p.sigma_ratio) is not None]
    if not ratios:
        return None
    stats = [
        {
            "label": name,
            "q1": r["p25"],
            "med": r["median"],
            "q3": r["p75"],
            "whislo": r["p01"],
            "whishi": r["p99"],
            "mean": r["mean"],
        }
        for name, r in ratios
    ]
    fig = Figure(figsize=(max(5.0, 1.0 + 0.9 * len(stats)) + 2.5, 4.5), layout="constrained")
    ax = fig.subplots()
    median = {"color": style.TAB10[1], "linewidth": 2}
    mean = {"marker": "D", "markerfacecolor": style.TAB10[0], "markeredgecolor": "k", "ms": 5}
    extreme = {"linestyle": "none", "markerfacecolor": "none", "markeredgecolor": "0.3", "ms": 6}
    ax.bxp(
        stats,
        showmeans=True,
        showfliers=False,
        medianprops=median,
        meanprops={**mean, "linestyle": "none"},
    )
    positions = range(1, len(stats) + 1)
    ax.plot(positions, [r["max"] for _, r in ratios], marker="^", **extreme)
    ax.plot(positions, [r["min"] for _, r in ratios], marker="v", **extreme)
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    lo = min(1.0, *(r["min"] for _, r in ratios))
    hi = max(1.0, *(r["max"] for _, r in ratios))
    _plain_log_ticks(ax.yaxis, hi / lo)
    ax.set_ylabel(r"$\sigma / \sigma_0$ per weight (log scale)")
    ax.set_title(r"Posterior $\sigma$ relative to its initial value $\sigma_0$")
    if len(stats) > 3 or max(len(s["label"]) for s in stats) > 8:
        for label in ax.get_xticklabels():
            label.set(rotation=30, horizontalalignment="right", rotation_mode="anchor")
    handles = [
        Patch(facecolor="none", edgecolor="k", label="p25 - p75"),
        Line2D([], [], label="median", **median),
        Line2D([], [], color="k", linewidth=1, label="whiskers: p01 - p99"),
        Line2D([], [], linestyle="none", label="mean", **mean),
        Line2D([], [], marker="^", label="max", **extreme),
        Line2D([], [], marker="v", label="min", **extreme),
        Line2D([], [], color="0.4", linestyle="--", linewidth=1, label=r"$\sigma = \sigma_0$"),
    ]
    fig.legend(handles=handles, loc="outside right upper", fontsize="small")
    return style.png(fig)


def sigma_table(predictors: list[PredictorResult]) -> Table | None:
    """Median sigma / sigma_0 per variational predictor, with its middle 80%.

    The number behind the sigma figure, readable without it; None when no
    predictor reports the ratio.
    """
    rows = [
        [Cell(p.name), Cell(f"{r['median']:.3g}"), Cell(f"{r['p10']:.3g} to {r['p90']:.3g}")]
        for p in predictors
        if (r := p.sigma_ratio) is not None
    ]
    return Table(["Predictor", "Median sigma/sigma_0", "p10 to p90"], rows) if rows else None


CAPTION = (
    "Per-weight posterior standard deviation sigma of each variational predictor, "
    "divided by sigma_0, the standard deviation the VI run was initialised with (log "
    "scale). Box: the middle half of the weights (p25 to p75), with the median as a "
    "line; whiskers: p01 to p99; open triangles: the largest (up) and smallest (down) "
    "ratio; diamond: the mean. Dashed line: sigma = sigma_0. Values near 1 mean the variance "
    "barely moved from its initialisation."
)


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    png = sigma_figure(inputs.predictors)
    return Section(figure_section("sigma", png, CAPTION, sigma_table(inputs.predictors)))
