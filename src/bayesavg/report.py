"""Final report of the pipeline: an offline HTML page and a Markdown twin.

Both documents are rendered from one set of precomputed sections (tables,
findings, figures), so they always carry the same numbers. Figures are drawn
on bare ``matplotlib.figure.Figure`` objects (no pyplot, hence no global
backend or figure state; PNGs are rendered by Agg) and saved without software
metadata, so identical inputs give byte-identical outputs. The HTML inlines
every figure as a base64 PNG and needs no network; the Markdown links the
PNGs written under ``figures/``.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import yaml
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator

from .io import write_bytes, write_text
from .methods import REGISTRY


@dataclass(frozen=True)
class PredictorResult:
    """Everything the report needs about one evaluated predictor."""

    name: str
    method: str
    trajectory: str
    scale: float
    metrics: dict[str, float]
    reliability: list[dict[str, float]]
    by_samples: list[dict[str, float]]


@dataclass(frozen=True)
class PlaneData:
    """One trajectory's loss plane, as the plane stage writes it (see ``bayesavg.plane``).

    ``grid`` rows: a, b, loss, accuracy. ``path`` rows: kind (snapshot,
    average, start), index, a, b, distance, loss, accuracy. ``summary``:
    at least explained_variance_ratio (two shares); start, n_points,
    n_snapshots, n_collected when known.
    """

    grid: list[dict[str, float]]
    path: list[dict[str, Any]]
    summary: dict[str, Any]


@dataclass(frozen=True)
class ReportInputs:
    """All report content; ``predictors`` are listed in table order.

    ``histories`` may carry per-epoch test columns (test_loss, test_accuracy
    and, for averaging runs, avg_test_loss, avg_test_accuracy); ``planes``
    maps a trajectory to its loss plane. Figures without data are left out.
    """

    title: str
    predictors: list[PredictorResult]
    histories: dict[str, list[dict[str, float]]]
    params: dict[str, Any]
    run_ids: dict[str, str]
    baseline: str = "map"
    notes: str = ""
    dataset_summary: dict[str, Any] = field(default_factory=dict)
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (reference, candidate)
    planes: dict[str, PlaneData] = field(default_factory=dict)


# (metric key, label, higher is better) for the findings.
_COMPARED = [
    ("accuracy", "accuracy", True),
    ("nll", "NLL", False),
    ("ece", "ECE", False),
    ("brier", "Brier", False),
]
# (metric key, column header, higher is better, formatter) for the metrics table.
_COLUMNS: list[tuple[str, str, bool, Callable[[float], str]]] = [
    ("accuracy", "Accuracy (%)", True, lambda v: f"{100 * v:.2f}"),
    ("nll", "NLL", False, lambda v: f"{v:.4f}"),
    ("ece", "ECE (20 bins)", False, lambda v: f"{v:.4f}"),
    ("ece15", "ECE (15 bins)", False, lambda v: f"{v:.4f}"),
    ("brier", "Brier", False, lambda v: f"{v:.4f}"),
    ("sharpness", "Sharpness (SAM)", False, lambda v: f"{v:.4f}"),
    ("hessian_trace", "tr(H)", False, lambda v: f"{v:.3g}"),
]
_COLOURS = matplotlib.colormaps["tab10"].colors
_CSS = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}"
    "th,td{border:1px solid #bbb;padding:4px 8px;text-align:right}"
    "th{background:#eee}td:first-child,th:first-child{text-align:left}"
    "img{max-width:100%}pre{background:#f6f6f6;padding:1em;overflow-x:auto}"
    "figcaption{font-style:italic;color:#555}"
)

Cell = tuple[str, bool]  # (text, bold)
Table = tuple[list[str], list[list[Cell]]]


def _metric(p: PredictorResult, key: str) -> float:
    value = p.metrics.get(key, math.nan)
    return float(value) if value is not None else math.nan


def comparison_lines(inputs: ReportInputs) -> list[str]:
    """State, per predictor and metric, whether it beats the baseline, as found.

    Every predictor is compared with ``baseline``; each (reference,
    candidate) in ``pairs`` (e.g. swag vs fswag, vi vs hwa) is compared too.
    Ties count as "does not improve": a finding must be earned, not assumed.
    """
    by_name = {p.name: p for p in inputs.predictors}
    base = by_name.get(inputs.baseline)
    if base is None:
        return [f"Baseline '{inputs.baseline}' is not among the predictors; no comparison made."]
    lines = []
    for p in inputs.predictors:
        if p.name != base.name:
            lines += _compare(p, base)
    for reference, candidate in inputs.pairs:
        if reference in by_name and candidate in by_name and reference != base.name:
            lines += _compare(by_name[candidate], by_name[reference])
    return lines


def _compare(p: PredictorResult, base: PredictorResult) -> list[str]:
    lines = []
    for key, label, higher in _COMPARED:
        ours, theirs = _metric(p, key), _metric(base, key)
        if not (math.isfinite(ours) and math.isfinite(theirs)):
            lines.append(f"{p.name} cannot be compared with {base.name} on {label}: missing")
            continue
        better = ours > theirs if higher else ours < theirs
        verdict = "improves" if better else "does not improve"
        if key == "accuracy":
            values = f"{100 * ours:.2f}% vs {100 * theirs:.2f}% ({100 * (ours - theirs):+.2f} pp)"
        else:
            values = f"{ours:.4f} vs {theirs:.4f} ({ours - theirs:+.4f})"
        lines.append(f"{p.name} {verdict} {label} over {base.name}: {values}")
    return lines


def pair_predictors(
    predictors: Mapping[str, tuple[str, str]], starts: Mapping[str, str]
) -> list[tuple[str, str]]:
    """(reference, candidate) pairs: each F-variant beside its baseline, HWA beside VI.

    ``predictors`` maps a name to (method, trajectory), ``starts`` a
    trajectory to the one it starts from. ``f<base>`` or ``f_<base>`` pairs
    with ``<base>`` by name; a predictor whose method starts with ``hwa``
    pairs with each ``vi`` predictor on its trajectory's start trajectory
    (the VI solution HWA continues from). Candidates keep the given order.
    """
    pairs: list[tuple[str, str]] = []
    for name, (method, trajectory) in predictors.items():
        base = name[2:] if name.startswith("f_") else name[1:] if name.startswith("f") else ""
        found = [base] if base in predictors and base != name else []
        baseline = REGISTRY[method].baseline if method in REGISTRY else None
        if baseline is not None:
            origin = starts.get(trajectory)
            found += [o for o, (m, t) in predictors.items() if m == baseline and t == origin]
        pairs += [(ref, name) for ref in found if (ref, name) not in pairs]
    return pairs


# (metric key, label, higher is better, value format, delta format) for pair comparisons.
_DELTAS: list[tuple[str, str, bool, Callable[[float], str], Callable[[float], str]]] = [
    ("accuracy", "accuracy", True, lambda v: f"{100 * v:.2f}", lambda d: f"{100 * d:+.2f}"),
    ("nll", "NLL", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("ece", "ECE", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("brier", "Brier", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("sharpness", "sharpness", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("hessian_trace", "tr(H)", False, lambda v: f"{v:.3g}", lambda d: f"{d:+.3g}"),
]
_PAIR_HEADERS = {
    "accuracy": "Accuracy (%) [Δ pp]",
    "nll": "NLL [Δ]",
    "ece": "ECE [Δ]",
    "brier": "Brier [Δ]",
    "sharpness": "Sharpness (SAM) [Δ]",
    "hessian_trace": "tr(H) [Δ]",
}
PAIRS_NOTE = (
    "Each reference predictor is followed by its counterparts. A counterpart's cell is "
    "its value and, in brackets, Δ = counterpart - reference (accuracy in percentage "
    "points). Bold: the counterpart is better (higher accuracy; lower NLL, ECE, Brier, "
    "sharpness, tr(H)); a tie is not bold."
)
NO_PAIRS = "No baseline/counterpart pairs among the predictors."
_HWA_CLAIMED = ("accuracy", "nll", "ece")
_F_CLAIMED = ("accuracy", "nll", "ece", "brier", "sharpness")


def _valid_pairs(inputs: ReportInputs) -> list[tuple[PredictorResult, PredictorResult]]:
    by_name = {p.name: p for p in inputs.predictors}
    return [
        (by_name[r], by_name[c])
        for r, c in inputs.pairs
        if r in by_name and c in by_name and r != c
    ]


def _better(key: str, ours: float, theirs: float) -> bool:
    higher = next(h for k, _, h, _, _ in _DELTAS if k == key)
    return ours > theirs if higher else ours < theirs


def _pairs_table(inputs: ReportInputs) -> Table | None:
    """References in table order, each followed by its counterparts with deltas."""
    pairs = _valid_pairs(inputs)
    if not pairs:
        return None
    order = [p.name for p in inputs.predictors]
    references = sorted({r.name for r, _ in pairs}, key=order.index)
    header = ["Predictor", "Role", *(_PAIR_HEADERS[k] for k, *_ in _DELTAS)]
    rows: list[list[Cell]] = []
    for ref_name in references:
        ref = next(r for r, _ in pairs if r.name == ref_name)
        row: list[Cell] = [(ref.name, False), ("reference", False)]
        for key, _, _, fmt, _ in _DELTAS:
            v = _metric(ref, key)
            row.append((fmt(v) if math.isfinite(v) else "n/a", False))
        rows.append(row)
        for _, cand in sorted(
            (pair for pair in pairs if pair[0].name == ref_name),
            key=lambda p: order.index(p[1].name),
        ):
            row = [(cand.name, False), (f"vs {ref.name}", False)]
            for key, _, _, fmt, dfmt in _DELTAS:
                ours, theirs = _metric(cand, key), _metric(ref, key)
                if not math.isfinite(ours):
                    row.append(("n/a", False))
                elif not math.isfinite(theirs):
                    row.append((f"{fmt(ours)} (n/a)", False))
                else:
                    cell = f"{fmt(ours)} ({dfmt(ours - theirs)})"
                    row.append((cell, _better(key, ours, theirs)))
            rows.append(row)
    return header, rows


def _claim(cand: PredictorResult, ref: PredictorResult, keys: tuple[str, ...]) -> str:
    """Win count of ``cand`` over ``ref`` on ``keys``, with the numbers; ties are not wins."""
    wins, losses, missing, values = [], [], [], []
    for key, label, _, fmt, dfmt in _DELTAS:
        if key not in keys:
            continue
        ours, theirs = _metric(cand, key), _metric(ref, key)
        if not (math.isfinite(ours) and math.isfinite(theirs)):
            missing.append(label)
            continue
        if _better(key, ours, theirs):
            wins.append(label)
        else:
            losses.append(label + (" (tied)" if ours == theirs else ""))
        unit = "%" if key == "accuracy" else ""
        delta = dfmt(ours - theirs) + (" pp" if key == "accuracy" else "")
        values.append(f"{label} {fmt(ours)}{unit} vs {fmt(theirs)}{unit} ({delta})")
    compared = len(wins) + len(losses)
    if not compared:
        return f"{cand.name} cannot be compared with {ref.name}: {', '.join(missing)} missing"
    text = f"{cand.name} beats {ref.name} on {len(wins)} of {compared}"
    text += f" ({', '.join(wins)})" if wins else ""
    text += f"; not on {', '.join(losses)}" if losses else ""
    text += f"; not compared on {', '.join(missing)} (missing)" if missing else ""
    return f"{text}: {', '.join(values)}"


def claim_sections(inputs: ReportInputs) -> list[tuple[str, list[str]]]:
    """Claims computed from the numbers, by kind of pair; empty kinds are left out.

    HWA vs VI on accuracy, NLL and ECE (each hwa-method predictor against its
    vi); each F-variant against its baseline on accuracy, NLL, ECE, Brier and
    sharpness; any other given pair on the latter set too.
    """
    hwa, flat, other = [], [], []
    for ref, cand in _valid_pairs(inputs):
        if cand.method in REGISTRY and REGISTRY[cand.method].baseline == ref.method == "vi":
            hwa.append(_claim(cand, ref, _HWA_CLAIMED))
        elif cand.name in (f"f{ref.name}", f"f_{ref.name}"):
            flat.append(_claim(cand, ref, _F_CLAIMED))
        else:
            other.append(_claim(cand, ref, _F_CLAIMED))
    sections = [
        ("HWA vs VI", hwa),
        ("Flat-seeking variants vs their baselines", flat),
        ("Other pairs", other),
    ]
    return [(title, lines) for title, lines in sections if lines]


def _kl_weight(params: dict[str, Any], trajectory: str) -> float:
    """The trajectory's VI KL weight from the raw params (1.0 where there is none)."""
    traj = params.get("finetune", {}).get(trajectory, {})
    vi = traj.get("vi") if isinstance(traj, dict) else None
    return float(vi.get("kl_weight", 1.0)) if isinstance(vi, dict) else 1.0


def _summary(inputs: ReportInputs) -> str:
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
        kl_weight = _kl_weight(inputs.params, p.trajectory)
        if kl_weight != 1.0:
            extra += f", tempered: KL weight {kl_weight:g}, not the true ELBO"
        described.append(f"{p.name} ({what}, trajectory {p.trajectory}{extra})")
    return (
        f"{data} Predictors: {'; '.join(described) or 'none'}. "
        f"Each is compared with the baseline {inputs.baseline}; "
        "lower is better for NLL, ECE and Brier, higher for accuracy."
    )


def _metrics_table(predictors: list[PredictorResult]) -> Table:
    """Rows of formatted cells; the best finite value of each metric column is bold."""
    best = {}
    for key, _, higher, _ in _COLUMNS:
        values = [v for p in predictors if math.isfinite(v := _metric(p, key))]
        best[key] = (max if higher else min)(values) if values else None
    header = ["Predictor", "Method", "Trajectory", "Scale", *(c[1] for c in _COLUMNS), "Samples"]
    rows = []
    for p in predictors:
        row: list[Cell] = [(p.name, False), (p.method, False), (p.trajectory, False)]
        row.append((f"{p.scale:g}", False))
        for key, _, _, fmt in _COLUMNS:
            v = _metric(p, key)
            row.append((fmt(v), v == best[key]) if math.isfinite(v) else ("n/a", False))
        n = _metric(p, "n_samples")
        row.append((f"{n:g}" if math.isfinite(n) else "n/a", False))
        rows.append(row)
    return header, rows


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _reliability_figure(predictors: list[PredictorResult]) -> bytes:
    fig = Figure(figsize=(10, 4), layout="constrained")
    gap_ax, rel_ax = fig.subplots(1, 2)
    width = 1.0 / max(len(predictors), 1)
    for i, p in enumerate(predictors):
        rows = [r for r in p.reliability if r.get("count", 0) > 0]
        conf = [r["confidence"] for r in rows]
        acc = [r["accuracy"] for r in rows]
        colour = _COLOURS[i % len(_COLOURS)]
        style = {"color": colour, "marker": "o", "ms": 3, "label": p.name}
        gap_ax.plot(conf, [a - c for a, c in zip(acc, conf, strict=True)], **style)
        # Classic reliability bars: one bar per non-empty bin, side by side per predictor.
        bin_width = [r["upper"] - r["lower"] for r in rows]
        left = [r["lower"] + i * width * w for r, w in zip(rows, bin_width, strict=True)]
        rel_ax.bar(
            left,
            acc,
            width=[width * w for w in bin_width],
            align="edge",
            color=colour,
            alpha=0.8,
            label=p.name,
        )
    gap_ax.axhline(0.0, color="k", linestyle="--", linewidth=1)
    gap_ax.set(xlabel="confidence", ylabel="accuracy - confidence", title="Calibration gap")
    rel_ax.plot([0, 1], [0, 1], color="k", linestyle="--", linewidth=1, label="perfect")
    rel_ax.set(
        xlabel="confidence (bin)", ylabel="accuracy", title="Reliability", xlim=(0, 1), ylim=(0, 1)
    )
    for ax in (gap_ax, rel_ax):
        ax.legend(fontsize="small")
    return _png(fig)


def _samples_figure(predictors: list[PredictorResult]) -> bytes:
    fig = Figure(figsize=(10, 4), layout="constrained")
    panels = [("nll", "NLL", 1.0), ("accuracy", "accuracy (%)", 100.0), ("ece", "ECE", 1.0)]
    for ax, (key, label, factor) in zip(fig.subplots(1, 3), panels, strict=True):
        for i, p in enumerate(predictors):
            rows = [r for r in p.by_samples if key in r]
            xs = [r["samples"] for r in rows]
            ys = [factor * r[key] for r in rows]
            colour = _COLOURS[i % len(_COLOURS)]
            if len(rows) == 1:
                ax.axhline(ys[0], color=colour, linestyle=":", label=p.name)
                ax.plot(xs, ys, color=colour, marker="s", ms=4)
            elif rows:
                ax.plot(xs, ys, color=colour, marker="o", ms=3, label=p.name)
        ax.set(xlabel="samples", ylabel=label, title=f"{label} vs samples")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.axes[0].legend(fontsize="small")
    return _png(fig)


def _training_figure(histories: dict[str, list[dict[str, float]]]) -> bytes:
    """Pretraining first, then each trajectory continuing after its last epoch."""
    fig = Figure(figsize=(10, 4), layout="constrained")
    loss_ax, acc_ax = fig.subplots(1, 2)
    pretrain = histories.get("pretrain", [])
    offset = len(pretrain)
    runs = [("pretrain", 0, "0.3")] if "pretrain" in histories else []
    others = [name for name in histories if name != "pretrain"]
    runs += [(n, offset, _COLOURS[i % len(_COLOURS)]) for i, n in enumerate(others)]
    for name, shift, colour in runs:
        for ax, metric in ((loss_ax, "loss"), (acc_ax, "accuracy")):
            for split, style in (("train", "-"), ("val", "--")):
                rows = [r for r in histories[name] if f"{split}_{metric}" in r]
                if rows:
                    xs = [shift + r["epoch"] for r in rows]
                    ys = [r[f"{split}_{metric}"] for r in rows]
                    ax.plot(xs, ys, style, color=colour, marker=".", label=f"{name} {split}")
    for ax, label in ((loss_ax, "loss"), (acc_ax, "accuracy")):
        if pretrain and others:
            ax.axvline(max(r["epoch"] for r in pretrain) + 0.5, color="k", ls=":", lw=1)
        ax.set(xlabel="epoch", ylabel=label, title=f"Training {label}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.legend(fontsize="small")
    return _png(fig)


def _trajectories(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Trajectory sections of the raw params that are mappings."""
    finetune = params.get("finetune", {})
    return (
        {k: v for k, v in finetune.items() if isinstance(v, dict)}
        if isinstance(finetune, dict)
        else {}
    )


def _epoch_offset(
    name: str, trajectories: dict[str, dict[str, Any]], histories: dict[str, list[dict[str, float]]]
) -> float:
    """Epochs before ``name`` starts, counted from the end of pretraining."""
    offset, seen = 0.0, {name}
    start = trajectories.get(name, {}).get("start", "pretrain")
    while start in trajectories and start not in seen:
        rows = histories.get(start, [])
        offset += max((r["epoch"] for r in rows), default=trajectories[start].get("epochs", 0))
        seen.add(start)
        start = trajectories[start].get("start", "pretrain")
    return offset


def _finetune_curves_figure(inputs: ReportInputs) -> bytes | None:
    """VI-family runs after pretraining: iterate solid, running average dashed.

    None when no VI-family history has per-epoch test columns (older runs).
    """
    trajectories = _trajectories(inputs.params)
    names = [
        n
        for n, t in trajectories.items()
        if t.get("kind") in ("vi", "hwa")
        and any("test_accuracy" in r for r in inputs.histories.get(n, []))
    ]
    if not names:
        return None
    fig = Figure(figsize=(13, 4), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = [
        ("train_loss", None, "Training loss", "negative ELBO per point", 1.0),
        ("test_loss", "avg_test_loss", "Test NLL", "NLL", 1.0),
        ("test_accuracy", "avg_test_accuracy", "Test accuracy", "accuracy (%)", 100.0),
    ]
    for i, name in enumerate(names):
        colour = _COLOURS[i % len(_COLOURS)]
        shift = _epoch_offset(name, trajectories, inputs.histories)
        rows = inputs.histories[name]
        for ax, (key, avg_key, _, _, factor) in zip(axes, panels, strict=True):
            for column, style, label in ((key, "-", name), (avg_key, "--", f"{name} average")):
                points = [
                    (shift + r["epoch"], factor * r[column])
                    for r in rows
                    if column is not None and column in r and math.isfinite(r[column])
                ]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, style, color=colour, marker=".", label=label)
    for ax, (_, _, title, label, _) in zip(axes, panels, strict=True):
        ax.set(xlabel="epochs since the end of pretraining", ylabel=label, title=title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.legend(fontsize="small")
    return _png(fig)


def _plane_grid(grid: list[dict[str, float]]) -> tuple[list[float], list[float], np.ndarray]:
    """Axis values and the loss as a (b, a) array; missing or non-finite cells masked."""
    a_values = sorted({r["a"] for r in grid})
    b_values = sorted({r["b"] for r in grid})
    col = {v: i for i, v in enumerate(a_values)}
    line = {v: i for i, v in enumerate(b_values)}
    z = np.full((len(b_values), len(a_values)), np.nan)
    for r in grid:
        z[line[r["b"]], col[r["a"]]] = r["loss"]
    return a_values, b_values, z


def _plane_panel(fig: Figure, ax: Any, name: str, plane: PlaneData) -> None:
    a_values, b_values, z = _plane_grid(plane.grid)
    finite = z[np.isfinite(z)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    log = lo > 0 and hi / lo > 10
    if hi <= lo:
        hi = lo + max(abs(lo), 1.0) * 1e-3
    levels = np.geomspace(lo, hi, 16) if log else np.linspace(lo, hi, 16)
    filled = ax.contourf(
        a_values,
        b_values,
        np.ma.masked_invalid(z),
        levels=levels,
        norm=LogNorm(lo, hi) if log else None,
        cmap="viridis",
    )
    bar = fig.colorbar(filled, ax=ax, label="training loss" + (" (log scale)" if log else ""))
    if log:
        bar.ax.yaxis.set_major_locator(LogLocator())
    snaps = sorted((r for r in plane.path if r["kind"] == "snapshot"), key=lambda r: r["index"])
    summary = plane.summary
    if snaps:
        n = summary.get("n_collected")
        label = f"snapshots {int(snaps[0]['index'])}..{int(snaps[-1]['index'])}"
        label += f" of {int(n)}" if n is not None else ""
        ax.plot(
            [r["a"] for r in snaps],
            [r["b"] for r in snaps],
            "-o",
            color="white",
            mec="black",
            ms=5,
            lw=1,
            label=label,
        )
        for r in (snaps[0], snaps[-1]):
            ax.annotate(
                str(int(r["index"])),
                (r["a"], r["b"]),
                xytext=(4, 4),
                textcoords="offset points",
                fontsize="small",
                color="white",
            )
    for r in plane.path:
        if r["kind"] == "average":
            label = f"average (loss {r['loss']:.3g})"
            ax.plot(r["a"], r["b"], "*", ms=15, color="red", mec="black", label=label)
        elif r["kind"] == "start":
            origin = summary.get("start")
            label = "start" + (f" {origin}" if origin else "") + f" (loss {r['loss']:.3g}), "
            label += f"{r['distance']:.3g} off the plane"
            ax.plot(r["a"], r["b"], "X", ms=10, color="orange", mec="black", label=label)
    ratio = summary.get("explained_variance_ratio", [math.nan, math.nan])
    points = summary.get("n_points")
    title = f"{name}: training loss" + (f" on {int(points)} images" if points else "")
    ax.set(
        xlabel=f"PC1 ({100 * ratio[0]:.1f}% of snapshot variance)",
        ylabel=f"PC2 ({100 * ratio[1]:.1f}% of snapshot variance)",
        title=title,
    )
    ax.legend(fontsize="small")


def _plane_figure(planes: dict[str, PlaneData]) -> bytes | None:
    """One loss-plane panel per trajectory; None without planes."""
    if not planes:
        return None
    cols = min(len(planes), 2)
    rows = math.ceil(len(planes) / cols)
    fig = Figure(figsize=(6.5 * cols, 5 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (name, plane) in zip(axes, planes.items(), strict=False):
        _plane_panel(fig, ax, name, plane)
    for ax in axes[len(planes) :]:
        ax.set_axis_off()
    return _png(fig)


_FIGURES: list[tuple[str, str]] = [
    ("reliability", "Calibration gap (left) and reliability curves (right); empty bins skipped."),
    ("samples", "Metrics of the Bayesian model average against the number of samples."),
    ("training", "Pretraining then fine-tuning; solid train, dashed validation."),
    (
        "finetune_curves",
        "VI-family fine-tuning, in epochs since the end of pretraining; a trajectory that "
        "starts from another continues after it (hwa after vi). Solid: the iterate (the "
        "variational mean mu); dashed: the running average of the snapshots taken so far. "
        "The training loss is the per-point negative ELBO that was optimised. The test "
        "curves are for monitoring only and were not used for any choice.",
    ),
    (
        "loss_plane",
        "Mean training cross-entropy of the network whose weights lie on the plane of the "
        "first two principal components of each trajectory's last snapshots (orthonormal "
        "directions in weight space, centred at their running average; for VI-family runs "
        "the snapshots are the means mu), on a fixed random subset of training images. "
        "Markers: the snapshots in collection order, the average (star), and the start "
        "projected onto the plane. The legend's losses are at the points themselves; the "
        "snapshots and the start can lie off the plane (the start's distance is given), "
        "while the contours show the plane only.",
    ),
]


def _fence(text: str, lang: str) -> str:
    """A Markdown code fence longer than any backtick run in ``text``, so it stays verbatim."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _md_table(table: Table) -> str:
    header, rows = table

    def cell(text: str, bold: bool) -> str:
        text = text.replace("|", "\\|")
        return f"**{text}**" if bold else text

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(*c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(table: Table) -> str:
    header, rows = table

    def cell(text: str, bold: bool) -> str:
        text = html.escape(text)
        return f"<td><strong>{text}</strong></td>" if bold else f"<td>{text}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(*c) for c in row) + "</tr>\n" for row in rows)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>"


def write_report(inputs: ReportInputs, out_dir: Path) -> dict[str, Path]:
    """Write report.html, report.md and figures/*.png; return their paths by name."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = _summary(inputs)
    metrics = _metrics_table(inputs.predictors)
    findings = comparison_lines(inputs)
    notes = inputs.notes or "No tuning notes were given."
    params = yaml.safe_dump(inputs.params, sort_keys=False)
    runs: Table = (
        ["Stage", "MLflow run id"],
        [[(s, False), (r, False)] for s, r in inputs.run_ids.items()],
    )
    drawn = {
        "reliability": _reliability_figure(inputs.predictors),
        "samples": _samples_figure(inputs.predictors),
        "training": _training_figure(inputs.histories),
        "finetune_curves": _finetune_curves_figure(inputs),
        "loss_plane": _plane_figure(inputs.planes),
    }
    pngs = {name: data for name, data in drawn.items() if data is not None}
    paths: dict[str, Path] = {}
    for name, data in pngs.items():
        paths[name] = out_dir / "figures" / f"{name}.png"
        write_bytes(paths[name], data)

    h = html.escape
    pairs = _pairs_table(inputs)
    claims = claim_sections(inputs)
    md = [f"# {inputs.title}", summary, "## Metrics", _md_table(metrics)]
    body = [f"<h1>{h(inputs.title)}</h1>", f"<p>{h(summary)}</p>", "<h2>Metrics</h2>"]
    body.append(_html_table(metrics))
    md.append("## Baselines and their counterparts")
    body.append("<h2>Baselines and their counterparts</h2>")
    if pairs is None:
        md.append(NO_PAIRS)
        body.append(f"<p>{h(NO_PAIRS)}</p>")
    else:
        md += [PAIRS_NOTE, _md_table(pairs)]
        body += [f"<p>{h(PAIRS_NOTE)}</p>", _html_table(pairs)]
    md.append("## Findings")
    md.append("\n".join(f"- {line}" for line in findings) or "No findings.")
    body.append("<h2>Findings</h2>")
    body.append("<ul>\n" + "".join(f"<li>{h(line)}</li>\n" for line in findings) + "</ul>")
    md.append("## Claims as found")
    body.append("<h2>Claims as found</h2>")
    if not claims:
        md.append(NO_PAIRS)
        body.append(f"<p>{h(NO_PAIRS)}</p>")
    for title, lines in claims:
        md += [f"### {title}", "\n".join(f"- {line}" for line in lines)]
        body += [
            f"<h3>{h(title)}</h3>",
            "<ul>\n" + "".join(f"<li>{h(line)}</li>\n" for line in lines) + "</ul>",
        ]
    for name, caption in _FIGURES:
        if name not in pngs:
            continue
        md += [f"## Figure: {name}", f"![{name}](figures/{name}.png)", f"*{caption}*"]
        b64 = base64.b64encode(pngs[name]).decode("ascii")
        body += [
            f"<h2>Figure: {name}</h2>",
            f'<figure><img src="data:image/png;base64,{b64}" alt="{name}">'
            f"<figcaption>{h(caption)}</figcaption></figure>",
        ]
    md += ["## Tuning", _fence(notes, "text"), "## Parameters", _fence(params, "yaml")]
    md += ["## MLflow runs", _md_table(runs)]
    body += [
        f"<h2>Tuning</h2>\n<pre>{h(notes)}</pre>",
        f"<h2>Parameters</h2>\n<pre>{h(params)}</pre>",
    ]
    body += ["<h2>MLflow runs</h2>", _html_table(runs)]

    paths["md"] = out_dir / "report.md"
    write_text(paths["md"], "\n\n".join(md) + "\n")
    page = (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{h(inputs.title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
    paths["html"] = out_dir / "report.html"
    write_text(paths["html"], page)
    return paths
