"""The loss landscape's figures: lines between centres, random rays, SWAG directions and
the sigma-distance curves; each a bare ``Figure`` (None without data)."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ... import style
from ...inputs import ReportInputs
from ...sigma_curves import sigma_curve_of
from .measures import line_series, ray_widths, total_loss

LINE_PANELS = (
    ("train_loss", "train loss (data term)"),
    ("total", "train loss + weight decay"),
    ("train_error", "train error"),
    ("test_error", "test error"),
)


def _line_values(line: Any, key: str) -> tuple[np.ndarray, np.ndarray]:
    return total_loss(line) if key == "total" else line_series(line, key)


def line_figure(inputs: ReportInputs) -> Figure | None:
    """Train loss, loss with weight decay, train and test error along each line."""
    lines = inputs.landscape.lines if inputs.landscape is not None else {}
    lines = {k: v for k, v in sorted(lines.items()) if v.rows}
    if not lines:
        return None
    fig = Figure(layout="constrained")
    axes = style.series_axes(fig, 1, len(LINE_PANELS), width=3.4, height=3.0)[0]
    for i, (name, line) in enumerate(lines.items()):
        label = f"{name}: {line.a} ({line.a_centre}) → {line.b} ({line.b_centre})"
        for ax, (key, _) in zip(axes, LINE_PANELS, strict=True):
            t, v = _line_values(line, key)
            ax.plot(t, v, color=style.TAB10[i % 10], marker="o", ms=2, label=label)
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
        return {"color": style.TAB10[i % 10], "linestyle": "-"}
    return {
        "color": colours.get(pick.name, style.TAB10[i % 10]),
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
    axes = style.series_axes(fig, 1, 2, width=4.6, height=3.4)[0]
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
        widths = ray_widths(ray)
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
    axes = style.series_axes(fig, len(swag), 2, width=4.4, height=2.6)
    for row, (traj, s) in zip(axes, swag.items(), strict=True):
        by_dir: dict[int, list[dict[str, float]]] = {}
        for r in s.directions:
            by_dir.setdefault(int(r["direction"]), []).append(r)
        for d, rs in sorted(by_dir.items()):
            rs = sorted(rs, key=lambda r: float(r["offset"]))
            offs = [float(r["offset"]) for r in rs]
            kw = {"color": style.TAB10[d % len(style.TAB10)], "marker": "o", "ms": 2}
            label = rf"PC {d + 1} ($\sigma$ = {float(rs[0]['sigma']):.3g})"
            row[0].plot(offs, [float(r["train_loss"]) for r in rs], label=label, **kw)
            row[1].plot(offs, [100 * (1 - float(r["test_error"])) for r in rs], label=label, **kw)
        row[0].set(ylabel="train loss (data term)")
        row[1].set(ylabel="test accuracy (%)")
        row[0].set_title(traj, loc="left", fontsize="medium", fontweight="bold")
        for ax in row:
            ax.grid(alpha=0.3)
        style.row_legend(row[1], framed=False)
    for ax in axes[-1]:
        ax.set_xlabel(r"offset (multiples of $\sigma$ along the direction)")
    return fig


def _sigma_curves(inputs: ReportInputs) -> list[tuple[str, Any, dict[str, Any]]]:
    """(label, curve, line style) of each pipeline SWAG posterior, then each DSWAG W."""
    found = []
    swag = inputs.landscape.swag if inputs.landscape is not None else {}
    for i, (traj, s) in enumerate(sorted(swag.items())):
        c = sigma_curve_of(s.sigma_distance)
        if c is not None:
            kw = trajectory_style(traj, inputs, i)
            found.append((rf"{traj}, $\|\sigma\|$ = {c.sigma_norm:.3g}", c, kw))
    greys = np.linspace(0.15, 0.65, max(len(inputs.dswag_sweep), 1))
    for grey, point in zip(greys, inputs.dswag_sweep, strict=False):
        c = sigma_curve_of(point.sigma_distance)
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
    multiples = sorted({m for _, c, _ in curves for m in c.multiples})
    style.symlog_axis(ax, multiples, min([m for m in multiples if m > 0], default=1.0))
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
