"""DSWAG's figures after the paper's Fig. 5 to 7: rounds to the target, reliability against
SWAG after distributed training, accuracy along theta_bar + m sigma z, metrics against W."""

from __future__ import annotations

import math
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from ... import style
from ...inputs import PredictorResult, ReportInputs, SweepPoint
from ...uncertainty import per_inputs
from .measures import SWEEP_PREDICTORS, dswag_roles, has_variance, point_curve


def _worker_colours(n: int) -> list[Any]:
    """One colour per worker count, ordered light to dark with W (viridis, no pale yellow)."""
    cmap = matplotlib.colormaps["viridis"]
    return [cmap(x) for x in np.linspace(0.85, 0.0, n)] if n > 1 else [cmap(0.3)]


def dswag_rounds_figure(sweep: list[SweepPoint]) -> bytes | None:
    """Fig. 5 left: the global model's train and test accuracy per phase-1 round, per W.

    The target (on train accuracy) is a dashed line; a star marks the round
    that reached it. None without a sweep history.
    """
    if not any(p.history for p in sweep):
        return None
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    train_ax, test_ax = fig.subplots(1, 2, sharey=True)
    target = sweep[0].target_accuracy
    for p, colour in zip(sweep, _worker_colours(len(sweep)), strict=True):
        rows = p.history
        label = f"W={p.workers}: " + (
            f"target at round {p.rounds_to_target}"
            if p.rounds_to_target is not None
            else f"not reached in {p.rounds} rounds"
        )
        xs = [r["epoch"] for r in rows]
        for ax, key in ((train_ax, "train_accuracy"), (test_ax, "test_accuracy")):
            points = [(x, 100 * r[key]) for x, r in zip(xs, rows, strict=True) if key in r]
            if points:
                ax.plot(*zip(*points, strict=True), color=colour, marker=".", ms=4, label=label)
        hit = [r for r in rows if r["epoch"] == p.rounds_to_target and "train_accuracy" in r]
        if hit:
            x, y = hit[0]["epoch"], 100 * hit[0]["train_accuracy"]
            train_ax.plot(x, y, "*", ms=13, color=colour, mec="black", zorder=3)
    train_ax.axhline(100 * target, color="k", linestyle="--", linewidth=1)
    test_ax.axhline(100 * target, color="0.5", linestyle=":", linewidth=1)
    train_ax.set(xlabel="phase-1 round", ylabel="accuracy (%)", title="Train accuracy")
    test_ax.set(xlabel="phase-1 round", title="Test accuracy")
    test_ax.tick_params(labelleft=True)
    for ax in (train_ax, test_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    handles, labels = train_ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], marker="*", ms=11, color="0.5", mec="black", linestyle="none"),
        Line2D([], [], color="k", linestyle="--", linewidth=1),
        Line2D([], [], color="0.5", linestyle=":", linewidth=1),
    ]
    labels += [
        "round that reached the target",
        f"target: {100 * target:g}% train accuracy",
        f"{100 * target:g}% on test (reference only)",
    ]
    fig.suptitle("Global (FedAvg) model after each phase-1 round")
    fig.legend(handles, labels, loc="outside right upper", fontsize="small", title="clients")
    return style.png(fig)


def dswag_reliability_figure(
    dswag: PredictorResult | None, baseline: PredictorResult | None
) -> bytes | None:
    """Fig. 5 right: accuracy - confidence per confidence bin, DSWAG vs SWAG after
    distributed training, beside the number of test points per bin (log scale).

    None unless both predictors have a non-empty bin.
    """
    pair = [
        (p, label)
        for p, label in ((dswag, "DSWAG"), (baseline, "SWAG after distributed training"))
        if p is not None and any(r.get("count", 0) > 0 for r in p.reliability)
    ]
    if len(pair) < 2:
        return None
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    gap_ax, count_ax = fig.subplots(1, 2, width_ratios=(3, 2))
    width = 1.0 / len(pair)
    for i, (p, label) in enumerate(pair):
        rows = [r for r in p.reliability if r.get("count", 0) > 0]
        colour = style.TAB10[i % len(style.TAB10)]
        name = f"{p.name} ({label})"
        conf = [r["confidence"] for r in rows]
        gap = [r["accuracy"] - r["confidence"] for r in rows]
        gap_ax.plot(conf, gap, color=colour, marker="o", ms=4, label=name)
        bin_width = [r["upper"] - r["lower"] for r in rows]
        left = [r["lower"] + i * width * w for r, w in zip(rows, bin_width, strict=True)]
        count_ax.bar(
            left,
            [r["count"] for r in rows],
            width=[width * w for w in bin_width],
            align="edge",
            color=colour,
            alpha=0.8,
            label=name,
        )
    gap_ax.axhline(0.0, color="k", linestyle="--", linewidth=1)
    gap_ax.set(
        xlabel="confidence (max of the predictive probabilities)",
        ylabel="accuracy - confidence",
        title="Calibration gap per bin (20 bins)",
    )
    props = {"transform": gap_ax.transAxes, "fontsize": "small", "color": "0.3", "ha": "left"}
    gap_ax.text(0.02, 0.97, "above 0: under-confident", va="top", **props)
    gap_ax.text(0.02, 0.03, "below 0: over-confident", va="bottom", **props)
    gap_ax.grid(alpha=0.3)
    count_ax.set_yscale("log")
    count_ax.set(xlabel="confidence (bin)", ylabel="test points (log scale)", xlim=(0, 1))
    count_ax.set_title("Points per bin")
    handles, labels = gap_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small")
    return style.png(fig)


def dswag_sigma_figure(sweep: list[SweepPoint]) -> bytes | None:
    """Fig. 6: test accuracy of theta_bar + m sigma z against m (left) and against
    m ||sigma||, the expected distance from theta_bar (right); mean over draws,
    min-max band, one curve per W. None without sigma-distance rows.
    """
    curves = [(p, c) for p in sweep if (c := point_curve(p)) is not None]
    if not curves:
        return None
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    m_ax, d_ax = fig.subplots(1, 2, sharey=True)
    multiples = sorted({m for _, c in curves for m in c.multiples})
    distances = sorted({m * c.sigma_norm for _, c in curves for m in c.multiples} - {0.0})
    handles = []
    for (p, c), colour in zip(curves, _worker_colours(len(curves)), strict=True):
        varied = has_variance(p, c)
        label = rf"W={p.workers}, $\|\sigma\|$ = {c.sigma_norm:.3g}"
        if not varied:
            label = rf"W={p.workers}: $\sigma = 0$ (< 2 snapshots: no variance)"
        mean = [100 * v for v in c.mean]
        look = {"color": colour, "marker": "o", "ms": 4, "linestyle": "-" if varied else ":"}
        (line,) = m_ax.plot(c.multiples, mean, label=label, **look)
        handles.append(line)
        low, high = [100 * v for v in c.low], [100 * v for v in c.high]
        m_ax.fill_between(c.multiples, low, high, color=colour, alpha=0.2)
        if varied:
            xs = [m * c.sigma_norm for m in c.multiples]
            d_ax.plot(xs, mean, **look)
            d_ax.fill_between(xs, low, high, color=colour, alpha=0.2)
    positive = [m for m in multiples if m > 0]
    style.symlog_axis(m_ax, multiples, min(positive, default=1.0))
    m_ax.set(
        xlabel=r"multiple $m$ of $\sigma$ (symmetric log scale; $m = 0$ is $\bar\theta$)",
        ylabel="test accuracy (%)",
        title=r"Accuracy of $\bar\theta + m\,\sigma \odot z$",
    )
    if distances:
        ticks = [0.0, *(v for v in (0.1, 0.3, 1, 3, 10, 30, 100, 300) if v <= max(distances))]
        style.symlog_axis(d_ax, ticks, min(distances))
    d_ax.set(
        xlabel=r"$m\,\|\sigma\|$, the expected distance from $\bar\theta$ (symmetric log)",
        title="The same against the distance",
    )
    d_ax.tick_params(labelleft=True)
    for ax in (m_ax, d_ax):
        ax.grid(alpha=0.3)
    handles.append(Patch(color="0.5", alpha=0.3, label="min to max over the draws z"))
    fig.legend(handles=handles, loc="outside right upper", fontsize="small", title="clients")
    return style.png(fig)


def dswag_workers_figure(sweep: list[SweepPoint]) -> bytes | None:
    """Fig. 7: test NLL, accuracy and ECE of FedAvg, DSWA and DSWAG against W.

    None without a sweep point with metrics.
    """
    if not any(math.isfinite(p.metric(k, "nll")) for p in sweep for k, _ in SWEEP_PREDICTORS):
        return None
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    panels = [("nll", "NLL", 1.0), ("accuracy", "accuracy (%)", 100.0), ("ece", "ECE", 1.0)]
    markers = {"fedavg": "s", "dswa": "o", "dswag": "D"}
    ws = [p.workers for p in sweep]
    for ax, (key, label, factor) in zip(fig.subplots(1, 3), panels, strict=True):
        for i, (name, title) in enumerate(SWEEP_PREDICTORS):
            points = [
                (p.workers, factor * v) for p in sweep if math.isfinite(v := p.metric(name, key))
            ]
            missing = [p.workers for p in sweep if p.metrics.get(name) is None]
            text = title + (
                f" (none at W={', '.join(map(str, missing))}: no variance)" if missing else ""
            )
            if points:
                colour = style.TAB10[i % len(style.TAB10)]
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, color=colour, marker=markers[name], ms=5, label=text)
        if max(ws) / min(ws) > 3:
            ax.set_xscale("log")
        ax.set_xticks(ws)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(xlabel="W, clients (log scale)", ylabel=label, title=f"Test {label} vs W")
        ax.grid(alpha=0.3)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small")
    return style.png(fig)


CAPTIONS = {
    "dswag_rounds": (
        "DSWAG phase 1 (FedAvg) for each number of clients W (the DSWAG paper's Fig. 5 left): "
        "accuracy of the global model after each round on the training split (left; phase 1 "
        "stops once it reaches the target, dashed; a star marks that round) and on the test "
        "split (right). The table gives the rounds to the target per W."
    ),
    "dswag_reliability": (
        "Reliability of DSWAG and of SWAG after distributed training (the DSWAG paper's Fig. 5 "
        "right): accuracy - confidence per confidence bin (20 equal-width bins, empty bins "
        "skipped; left) and the test points per bin (right), since bins with few points are "
        "noisy. Above 0 the predictor is under-confident (right more often than it claims), "
        "below 0 over-confident; the paper's text states this sign the other way round, "
        "which is backwards."
    ),
    "dswag_sigma_distance": (
        "Test accuracy of the single network theta_bar + m * sigma * z (theta_bar: the DSWAG "
        "mean, sigma: the square root of its diagonal variance, z ~ N(0, I) seeded, the same z "
        "for every m and W) for each number of clients W (the DSWAG paper's Fig. 6). Line: "
        "the mean over the draws z; band: their min to max. Left against the multiple m, right "
        "against m ||sigma||, the expected distance from theta_bar, since sigma differs by W. "
        "A W with fewer than 2 snapshots has sigma = 0 (dotted, left only): every m is theta_bar."
    ),
    "dswag_workers": (
        "Test NLL, accuracy and ECE of the FedAvg model, DSWA and DSWAG against the number of "
        "clients W (the DSWAG paper's Fig. 7). Each W is a separate run whose phase 1 stopped at "
        "the target or the round cap (see the rounds figure), so W also changes how long phase "
        "1 ran. One run per W and no intervals: the table's bold marks the best value of the "
        "three at a W, not a difference beyond noise (one test image more or less moves the "
        "accuracy by 1/n of the n test images)."
    ),
}


@per_inputs
def drawn(inputs: ReportInputs) -> dict[str, bytes]:
    """PNG bytes of each figure that has data, by name in report order; once per inputs,
    since the text section names them before the figure section shows them."""
    roles = dswag_roles(inputs)
    dswag, base = (roles.dswag, roles.baseline) if roles is not None else (None, None)
    sweep = inputs.dswag_sweep
    found = {
        "dswag_rounds": dswag_rounds_figure(sweep),
        "dswag_reliability": dswag_reliability_figure(dswag, base),
        "dswag_sigma_distance": dswag_sigma_figure(sweep),
        "dswag_workers": dswag_workers_figure(sweep),
    }
    return {name: png for name, png in found.items() if png is not None}
