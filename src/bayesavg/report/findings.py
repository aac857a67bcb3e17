"""What beats what, as text and tables: no plotting, no rendering.

Every function here is pure over the input dataclasses, so the numbers a
reader sees are testable without drawing or writing anything. A finding
must be earned: ties and missing values never count as an improvement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..methods import REGISTRY
from .inputs import PredictorResult, ReportInputs


class Cell(NamedTuple):
    """One table cell; bold marks the best value or an improvement."""

    text: str
    bold: bool = False


class Table(NamedTuple):
    """A header and rows of cells, the same for HTML and Markdown."""

    header: list[str]
    rows: list[list[Cell]]


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
        ours, theirs = p.metric(key), base.metric(key)
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
    with ``<base>`` by name; a predictor whose method has a registry
    ``baseline`` (hwa: vi) pairs with each predictor of that method on its
    trajectory's start trajectory (the VI solution HWA continues from).
    Candidates keep the given order.
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


def pairs_table(inputs: ReportInputs) -> Table | None:
    """References in table order, each followed by its counterparts with deltas.

    None without valid pairs, so the report can say so instead of showing
    an empty table.
    """
    pairs = _valid_pairs(inputs)
    if not pairs:
        return None
    order = [p.name for p in inputs.predictors]
    references = sorted({r.name for r, _ in pairs}, key=order.index)
    header = ["Predictor", "Role", *(_PAIR_HEADERS[k] for k, *_ in _DELTAS)]
    rows: list[list[Cell]] = []
    for ref_name in references:
        ref = next(r for r, _ in pairs if r.name == ref_name)
        row = [Cell(ref.name), Cell("reference")]
        for key, _, _, fmt, _ in _DELTAS:
            v = ref.metric(key)
            row.append(Cell(fmt(v) if math.isfinite(v) else "n/a"))
        rows.append(row)
        for _, cand in sorted(
            (pair for pair in pairs if pair[0].name == ref_name),
            key=lambda p: order.index(p[1].name),
        ):
            row = [Cell(cand.name), Cell(f"vs {ref.name}")]
            for key, _, _, fmt, dfmt in _DELTAS:
                ours, theirs = cand.metric(key), ref.metric(key)
                if not math.isfinite(ours):
                    row.append(Cell("n/a"))
                elif not math.isfinite(theirs):
                    row.append(Cell(f"{fmt(ours)} (n/a)"))
                else:
                    cell = f"{fmt(ours)} ({dfmt(ours - theirs)})"
                    row.append(Cell(cell, _better(key, ours, theirs)))
            rows.append(row)
    return Table(header, rows)


def _claim(cand: PredictorResult, ref: PredictorResult, keys: tuple[str, ...]) -> str:
    """Win count of ``cand`` over ``ref`` on ``keys``, with the numbers; ties are not wins."""
    wins, losses, missing, values = [], [], [], []
    for key, label, _, fmt, dfmt in _DELTAS:
        if key not in keys:
            continue
        ours, theirs = cand.metric(key), ref.metric(key)
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
        kl_weight = _kl_weight(inputs.params, p.trajectory)
        if kl_weight != 1.0:
            extra += f", tempered: KL weight {kl_weight:g}, not the true ELBO"
        described.append(f"{p.name} ({what}, trajectory {p.trajectory}{extra})")
    return (
        f"{data} Predictors: {'; '.join(described) or 'none'}. "
        f"Each is compared with the baseline {inputs.baseline}; "
        "lower is better for NLL, ECE and Brier, higher for accuracy."
    )


def metrics_table(predictors: list[PredictorResult]) -> Table:
    """Rows of formatted cells; the best finite value of each metric column is bold."""
    best = {}
    for key, _, higher, _ in _COLUMNS:
        values = [v for p in predictors if math.isfinite(v := p.metric(key))]
        best[key] = (max if higher else min)(values) if values else None
    header = ["Predictor", "Method", "Trajectory", "Scale", *(c[1] for c in _COLUMNS), "Samples"]
    rows = []
    for p in predictors:
        row = [Cell(p.name), Cell(p.method), Cell(p.trajectory), Cell(f"{p.scale:g}")]
        for key, _, _, fmt in _COLUMNS:
            v = p.metric(key)
            row.append(Cell(fmt(v), v == best[key]) if math.isfinite(v) else Cell("n/a"))
        n = p.metric("n_samples")
        row.append(Cell(f"{n:g}" if math.isfinite(n) else "n/a"))
        rows.append(row)
    return Table(header, rows)


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
