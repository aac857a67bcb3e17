"""The analyses' figures: each builder returns a bare ``Figure`` (None without data) so a
test can inspect it before ``png`` encodes it byte-identically (no software metadata)."""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from . import analyses_numbers as num
from . import style
from .inputs import PredictorResult, ReportInputs

_TAB10 = matplotlib.colormaps["tab10"].colors
# (shift metric, axis label, factor)
SHIFT_PANELS = (
    ("accuracy", "accuracy (%)", 100.0),
    ("nll", "NLL", 1.0),
    ("ece", "ECE", 1.0),
    ("entropy", "entropy H[p̄] (nats)", 1.0),
)
LINE_PANELS = (
    ("train_loss", "train loss (data term)"),
    ("total", "train loss + weight decay"),
    ("train_error", "train error"),
    ("test_error", "test error"),
)
MAX_HISTOGRAMS = 8


def png(fig: Figure) -> bytes:
    """PNG bytes without software metadata: identical figures give identical bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _series(
    fig: Figure, rows: int, cols: int, width: float = 3.3, height: float = 2.4
) -> np.ndarray:
    """A grid of axes on a constrained-layout figure sized for readable panels."""
    fig.set_size_inches(min(width * cols + 2.5, 18), height * rows + 0.8)
    return fig.subplots(rows, cols, squeeze=False)


def _style(p: PredictorResult, inputs: ReportInputs, colours: dict[str, Any]) -> dict[str, Any]:
    return {"color": colours.get(p.name, "k"), "linestyle": style.linestyle(p, inputs)}


def _row_legend(ax: Any) -> None:
    """The row's legend right of its last panel, outside the axes."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)


# ---------------------------------------------------------------- dataset shift


def _shift_groups(inputs: ReportInputs) -> dict[str, list[PredictorResult]]:
    """Family -> predictors with rotations, the baseline first in each."""
    base = style.baseline(inputs)
    lead = [base] if base is not None and num.angles(base) else []
    groups = {
        title: lead + [p for p in ps if num.angles(p)]
        for title, ps in style.families(inputs).items()
    }
    return {t: ps for t, ps in groups.items() if any(p.name != inputs.baseline for p in ps)}


def shift_figure(inputs: ReportInputs) -> Figure | None:
    """Accuracy, NLL, ECE and entropy against rotation angle: a row per family, a column
    per metric (each on its own axis)."""
    groups = _shift_groups(inputs)
    if not groups:
        return None
    colours = style.colours(inputs)
    fig = Figure(layout="constrained")
    axes = _series(fig, len(groups), len(SHIFT_PANELS))
    for row, (title, ps) in zip(axes, groups.items(), strict=True):
        for ax, (key, label, factor) in zip(row, SHIFT_PANELS, strict=True):
            for p in ps:
                xs = [a for a, _ in num.angles(p)]
                ys = [factor * num.shift_value(p, n, key) for _, n in num.angles(p)]
                ax.plot(xs, ys, marker="o", ms=3, label=p.name, **_style(p, inputs, colours))
            ax.set_xticks([0, 45, 90, 135, 180])
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        row[0].set_title(title, loc="left", fontsize="medium", fontweight="bold")
        _row_legend(row[-1])
    for ax in axes[-1]:
        ax.set_xlabel("rotation (degrees)")
    return fig


def shift_gap_figure(inputs: ReportInputs, gaps: list[num.ShiftGap]) -> Figure | None:
    """NLL(baseline) - NLL(predictor) against angle with 95% paired-bootstrap bars, a panel
    per family."""
    if not gaps:
        return None
    by_name = {g.predictor: g for g in gaps}
    groups = {
        t: [by_name[p.name] for p in ps if p.name in by_name]
        for t, ps in style.families(inputs).items()
    }
    groups = {t: gs for t, gs in groups.items() if gs}
    colours = style.colours(inputs)
    predictors = {p.name: p for p in inputs.predictors}
    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig = Figure(layout="constrained")
    axes = _series(fig, rows, cols, width=4.2, height=2.8).ravel()
    for ax, (title, gs) in zip(axes, groups.items(), strict=False):
        for g in gs:
            kw = _style(predictors[g.predictor], inputs, colours)
            bounds = g.bounds()
            yerr = None
            if bounds is not None:
                yerr = [
                    [v - lo for v, lo in zip(g.gap, bounds[0], strict=True)],
                    [hi - v for v, hi in zip(g.gap, bounds[1], strict=True)],
                ]
            ax.errorbar(
                g.angles, g.gap, yerr=yerr, marker="o", ms=3, capsize=2, label=g.predictor, **kw
            )
        ax.axhline(0.0, color="k", linewidth=0.8)
        ax.set_title(title, fontsize="medium")
        ax.set_xticks([0, 45, 90, 135, 180])
        ax.set(xlabel="rotation (degrees)", ylabel=f"NLL({inputs.baseline}) - NLL(predictor)")
        ax.grid(alpha=0.3)
        _row_legend(ax)
    for ax in axes[len(groups) :]:
        ax.set_axis_off()
    return fig


# ---------------------------------------------------------------- OOD


def _representatives(inputs: ReportInputs, ood_set: str) -> list[PredictorResult]:
    """The baseline and the first predictor of each family with per-point entropies,
    an averaging one where the family has it (SWAG before SWA)."""

    def has(p: PredictorResult | None) -> bool:
        return p is not None and num.ood_counts(p, ood_set) is not None

    base = style.baseline(inputs)
    chosen = [base] if has(base) else []
    for ps in style.families(inputs).values():
        ranked = sorted(ps, key=lambda p: not num.is_bayesian(p))
        first = next((p for p in ranked if has(p)), None)
        if first is not None:
            chosen.append(first)
    return chosen[:MAX_HISTOGRAMS]


def ood_histogram_figure(inputs: ReportInputs, ood_set: str) -> Figure | None:
    """H[p̄] on the test split and on the OOD set, one panel per representative predictor."""
    chosen = _representatives(inputs, ood_set)
    if not chosen:
        return None
    scores = [(p, p.predictions.ood_scores) for p in chosen if p.predictions is not None]
    top = max(
        float(np.max(s[k]["entropy"]))
        for _, s in scores
        for k in ("test", ood_set)
        if len(s[k]["entropy"])
    )
    bins = np.linspace(0.0, max(top, 1e-6), 31)
    cols = min(4, len(scores))
    fig = Figure(layout="constrained")
    axes = _series(fig, math.ceil(len(scores) / cols), cols, width=3.2, height=2.5).ravel()
    for ax, (p, s) in zip(axes, scores, strict=False):
        ax.hist(s["test"]["entropy"], bins=bins, density=True, alpha=0.6, color=_TAB10[0])
        ax.hist(s[ood_set]["entropy"], bins=bins, density=True, alpha=0.6, color=_TAB10[3])
        auroc = num.ood_value(p, ood_set, "entropy", "auroc")
        ax.set_title(f"{p.name} (AUROC {auroc:.3f})", fontsize="medium")
        ax.set_yscale("log")
        ax.set_xlabel("H[p̄] (nats)")
    for ax in axes[len(scores) :]:
        ax.set_axis_off()
    fig.supylabel("density (log scale)")
    handles = [
        Patch(color=_TAB10[0], alpha=0.6, label="test (in-distribution)"),
        Patch(color=_TAB10[3], alpha=0.6, label=f"{ood_set} (OOD)"),
    ]
    fig.legend(handles=handles, loc="outside upper center", ncols=2, fontsize="small")
    return fig


# ---------------------------------------------------------------- landscape


def _line_values(line: Any, key: str) -> tuple[np.ndarray, np.ndarray]:
    return num.total_loss(line) if key == "total" else num.line_series(line, key)


def line_figure(inputs: ReportInputs) -> Figure | None:
    """Train loss, loss with weight decay, train and test error along each line."""
    lines = inputs.landscape.lines if inputs.landscape is not None else {}
    lines = {k: v for k, v in sorted(lines.items()) if v.rows}
    if not lines:
        return None
    fig = Figure(layout="constrained")
    axes = _series(fig, 1, len(LINE_PANELS), width=3.4, height=3.0)[0]
    for i, (name, line) in enumerate(lines.items()):
        label = f"{name}: {line.a} ({line.a_centre}) → {line.b} ({line.b_centre})"
        for ax, (key, _) in zip(axes, LINE_PANELS, strict=True):
            t, v = _line_values(line, key)
            ax.plot(t, v, color=_TAB10[i % 10], marker="o", ms=2, label=label)
    for ax, (_, ylabel) in zip(axes, LINE_PANELS, strict=True):
        for t in (0.0, 1.0):
            ax.axvline(t, color="0.5", linestyle=":", linewidth=1)
        ax.set(xlabel="t (0: a, 1: b)", ylabel=ylabel)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small")
    return fig


def trajectory_style(trajectory: str, inputs: ReportInputs, i: int) -> dict[str, Any]:
    """The colour and dash of the predictor that shares the trajectory's name (else its
    first predictor); the baseline's for the baseline's trajectory."""
    colours = style.colours(inputs)
    ps = [p for p in inputs.predictors if p.trajectory == trajectory]
    pick = next((p for p in ps if p.name == trajectory), None)
    pick = next((p for p in ps if p.name == inputs.baseline), pick) or (ps[0] if ps else None)
    if pick is None:
        return {"color": _TAB10[i % 10], "linestyle": "-"}
    return {
        "color": colours.get(pick.name, _TAB10[i % 10]),
        "linestyle": style.linestyle(pick, inputs),
    }


def rays_figure(inputs: ReportInputs) -> Figure | None:
    """Train loss and test error against distance from each centre: every direction thin,
    the mean over directions bold."""
    rays = inputs.landscape.rays if inputs.landscape is not None else {}
    rays = {k: r for k, r in rays.items() if r.rows}
    if not rays:
        return None
    fig = Figure(layout="constrained")
    axes = _series(fig, 1, 2, width=4.6, height=3.4)[0]
    handles = []
    for i, (traj, ray) in enumerate(rays.items()):
        kw = trajectory_style(traj, inputs, i)
        for ax, key in zip(axes, ("train_loss", "test_error"), strict=True):
            by_dir: dict[float, list[tuple[float, float]]] = {}
            for r in ray.rows:
                by_dir.setdefault(float(r["direction"]), []).append(
                    (float(r["distance"]), float(r[key]))
                )
            curves = [sorted(v) for _, v in sorted(by_dir.items())]
            for c in curves:
                ax.plot(*zip(*c, strict=True), color=kw["color"], alpha=0.25, linewidth=0.7)
            xs = [d for d, _ in curves[0]]
            mean = [float(np.mean([c[j][1] for c in curves if j < len(c)])) for j in range(len(xs))]
            (line,) = ax.plot(xs, mean, linewidth=2, **kw)
        widths = num.ray_widths(ray)
        handles.append((line, f"{traj} ({ray.centre}); mean width {np.mean(widths):.3g}"))
    axes[0].set_yscale("log")
    axes[0].set(xlabel="distance along the direction", ylabel="train loss (data term, log)")
    axes[1].set(xlabel="distance along the direction", ylabel="test error")
    for ax in axes:
        ax.grid(alpha=0.3)
    lines, labels = zip(*handles, strict=True)
    fig.legend(lines, labels, loc="outside right upper", fontsize="small", title="centre")
    return fig


def swag_directions_figure(inputs: ReportInputs) -> Figure | None:
    """Train loss and test accuracy along each SWAG posterior's top principal directions,
    in multiples of the standard deviation along each."""
    swag = inputs.landscape.swag if inputs.landscape is not None else {}
    swag = {k: s for k, s in sorted(swag.items()) if s.directions}
    if not swag:
        return None
    fig = Figure(layout="constrained")
    axes = _series(fig, len(swag), 2, width=4.4, height=2.6)
    for row, (traj, s) in zip(axes, swag.items(), strict=True):
        by_dir: dict[int, list[dict[str, float]]] = {}
        for r in s.directions:
            by_dir.setdefault(int(r["direction"]), []).append(r)
        for d, rs in sorted(by_dir.items()):
            rs = sorted(rs, key=lambda r: float(r["offset"]))
            offs = [float(r["offset"]) for r in rs]
            kw = {"color": _TAB10[d % len(_TAB10)], "marker": "o", "ms": 2}
            label = rf"PC {d + 1} ($\sigma$ = {float(rs[0]['sigma']):.3g})"
            row[0].plot(offs, [float(r["train_loss"]) for r in rs], label=label, **kw)
            row[1].plot(offs, [100 * (1 - float(r["test_error"])) for r in rs], label=label, **kw)
        row[0].set(ylabel="train loss (data term)")
        row[1].set(ylabel="test accuracy (%)")
        row[0].set_title(traj, loc="left", fontsize="medium", fontweight="bold")
        for ax in row:
            ax.grid(alpha=0.3)
        _row_legend(row[1])
    for ax in axes[-1]:
        ax.set_xlabel(r"offset (multiples of $\sigma$ along the direction)")
    return fig


def _symlog(ax: Any, multiples: list[float]) -> None:
    positive = [m for m in multiples if m > 0]
    linthresh = min(positive, default=1.0)
    ax.set_xscale("symlog", linthresh=linthresh, linscale=0.5)
    ax.set_xticks(multiples)
    ax.set_xlim(left=-0.3 * linthresh)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _sigma_curves(inputs: ReportInputs) -> list[tuple[str, Any, dict[str, Any]]]:
    """(label, curve, line style) of each pipeline SWAG posterior, then each DSWAG W."""
    found = []
    swag = inputs.landscape.swag if inputs.landscape is not None else {}
    for i, (traj, s) in enumerate(sorted(swag.items())):
        c = num.sigma_curve(s.sigma_distance)
        if c is not None:
            kw = trajectory_style(traj, inputs, i)
            found.append((rf"{traj}, $\|\sigma\|$ = {c.sigma_norm:.3g}", c, kw))
    greys = np.linspace(0.15, 0.65, max(len(inputs.dswag_sweep), 1))
    for grey, point in zip(greys, inputs.dswag_sweep, strict=False):
        c = num.sigma_curve(point.sigma_distance)
        if c is not None:
            kw = {"color": str(round(float(grey), 3)), "linestyle": ":"}
            found.append((f"DSWAG sweep W={point.workers} (as in the DSWAG figure)", c, kw))
    return found


def sigma_distance_figure(inputs: ReportInputs) -> Figure | None:
    """Test accuracy of theta_bar + m sigma z against m for every SWAG-kind posterior and
    the DSWAG sweep; mean over draws, min-max band."""
    curves = _sigma_curves(inputs)
    if not curves:
        return None
    fig = Figure(figsize=(10, 4.4), layout="constrained")
    ax = fig.subplots()
    for label, c, kw in curves:
        ax.plot(c.multiples, [100 * v for v in c.mean], marker="o", ms=3, label=label, **kw)
        ax.fill_between(
            c.multiples,
            [100 * v for v in c.low],
            [100 * v for v in c.high],
            color=kw["color"],
            alpha=0.15,
        )
    _symlog(ax, sorted({m for _, c, _ in curves for m in c.multiples}))
    ax.set(
        xlabel=r"multiple $m$ of $\sigma$ (symmetric log; $m = 0$ is $\bar\theta$)",
        ylabel="test accuracy (%)",
    )
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Patch(color="0.5", alpha=0.3))
    labels.append("min to max over the draws z")
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    return fig


# ---------------------------------------------------------------- sharpness


SHARPNESS_AXES = (
    ("hessian_trace", "tr(H) (log scale)"),
    ("sharpness", "SAM sharpness (log scale)"),
)
CALIBRATION_AXES = (("nll", "test NLL"), ("ece", "test ECE"))


def _sharp_points(inputs: ReportInputs, x: str, y: str) -> list[PredictorResult]:
    return [
        p for p in inputs.predictors if 0 < p.metric(x) < math.inf and math.isfinite(p.metric(y))
    ]


def sharpness_figure(inputs: ReportInputs) -> Figure | None:
    """NLL and ECE against tr(H) and SAM sharpness, a labelled point per predictor."""
    if not any(_sharp_points(inputs, x, "nll") for x, _ in SHARPNESS_AXES):
        return None
    colours = style.colours(inputs)
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(2, 2, squeeze=False)
    for j, (x, xlabel) in enumerate(SHARPNESS_AXES):
        for i, (y, ylabel) in enumerate(CALIBRATION_AXES):
            ax = axes[i][j]
            points = _sharp_points(inputs, x, y)
            for p in points:
                flat = style.linestyle(p, inputs) == "--"
                colour = colours.get(p.name, "k")
                ax.scatter(
                    p.metric(x),
                    p.metric(y),
                    s=30,
                    color="none" if flat else colour,
                    edgecolors=colour,
                )
                ax.annotate(
                    p.name,
                    (p.metric(x), p.metric(y)),
                    xytext=(3, 3),
                    textcoords="offset points",
                    fontsize="x-small",
                )
            corr = num.correlation(inputs.predictors, x, y)
            title = (
                rf"Spearman $\rho$ = {corr.rho:+.2f} (n = {corr.n})" if corr else "too few points"
            )
            if points:
                ax.set_xscale("log")
                ax.margins(x=0.15, y=0.08)
            ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
            ax.grid(alpha=0.3)
    handles = [
        Line2D([], [], marker="o", linestyle="", color="0.3", label="averaging / single network"),
        Line2D(
            [],
            [],
            marker="o",
            linestyle="",
            color="0.3",
            markerfacecolor="none",
            label="flat-seeking (SAM) variant",
        ),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize="small")
    return fig
