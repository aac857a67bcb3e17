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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import yaml
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .io import write_bytes, write_text


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
class ReportInputs:
    """All report content; ``predictors`` are listed in table order."""

    title: str
    predictors: list[PredictorResult]
    histories: dict[str, list[dict[str, float]]]
    params: dict[str, Any]
    run_ids: dict[str, str]
    baseline: str = "map"
    notes: str = ""
    dataset_summary: dict[str, Any] = field(default_factory=dict)
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (reference, candidate)


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
_METHODS = {
    "map": "the fine-tuned point estimate",
    "swa": "the SWA mean of the fine-tuning iterates",
    "swag_diag": "SWAG with a diagonal Gaussian",
    "swag": "SWAG with a low-rank plus diagonal Gaussian",
    "vi": "the last mean-field VI iterate",
    "hwa": "HWA, moment-matched mixture of the averaged Gaussians",
    "hwa_mf": "HWA with averaged mean-field hyperparameters",
    "hwa_rho": "HWA averaged in rho-space",
}
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
        what = _METHODS.get(p.method, f"method {p.method}")
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


_FIGURES: list[tuple[str, str]] = [
    ("reliability", "Calibration gap (left) and reliability curves (right); empty bins skipped."),
    ("samples", "Metrics of the Bayesian model average against the number of samples."),
    ("training", "Pretraining then fine-tuning; solid train, dashed validation."),
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
    pngs = {
        "reliability": _reliability_figure(inputs.predictors),
        "samples": _samples_figure(inputs.predictors),
        "training": _training_figure(inputs.histories),
    }
    paths: dict[str, Path] = {}
    for name, data in pngs.items():
        paths[name] = out_dir / "figures" / f"{name}.png"
        write_bytes(paths[name], data)

    md = [f"# {inputs.title}", summary, "## Metrics", _md_table(metrics), "## Findings"]
    md.append("\n".join(f"- {line}" for line in findings) or "No findings.")
    h = html.escape
    body = [f"<h1>{h(inputs.title)}</h1>", f"<p>{h(summary)}</p>", "<h2>Metrics</h2>"]
    body += [_html_table(metrics), "<h2>Findings</h2>"]
    body.append("<ul>\n" + "".join(f"<li>{h(line)}</li>\n" for line in findings) + "</ul>")
    for name, caption in _FIGURES:
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
