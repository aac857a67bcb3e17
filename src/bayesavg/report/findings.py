"""What beats what, as text and tables: no plotting, no rendering.

Every function here is pure over the input dataclasses and the intervals
of ``uncertainty``, so the numbers a reader sees are testable without
drawing or writing anything. A finding must be earned: a counterpart
"improves" only where the 95% interval of the difference excludes 0;
otherwise it is "within noise", and without per-point predictions there is
no verdict at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..intervals import LOWER_IS_BETTER, Estimate, Interval
from ..methods import REGISTRY
from .claims import Claim
from .inputs import PredictorResult, ReportInputs
from .uncertainty import Comparison, Uncertainty


class Cell(NamedTuple):
    """One table cell; bold marks the best value or an improvement."""

    text: str
    bold: bool = False


class Table(NamedTuple):
    """A header and rows of cells, the same for HTML and Markdown."""

    header: list[str]
    rows: list[list[Cell]]


# (metric key, label, higher is better, value format, delta format) for pair comparisons.
_DELTAS: list[tuple[str, str, bool, Callable[[float], str], Callable[[float], str]]] = [
    ("accuracy", "accuracy", True, lambda v: f"{100 * v:.2f}", lambda d: f"{100 * d:+.2f}"),
    ("nll", "NLL", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("ece", "ECE", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("brier", "Brier", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("sharpness", "sharpness", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("hessian_trace", "tr(H)", False, lambda v: f"{v:.3g}", lambda d: f"{d:+.3g}"),
]
_HWA_CLAIMED = ("accuracy", "nll", "ece")
_F_CLAIMED = ("accuracy", "nll", "ece", "brier")
HWA_PAPER = "HWA (Karimi & Li)"
FLAT_PAPER = "Flat-seeking posteriors (Nguyen et al. 2023)"
_LABELS = {"accuracy": "accuracy", "nll": "NLL", "ece": "ECE", "brier": "Brier"}
# (metric key, column header) of the metrics table; each cell carries its interval.
_COLUMNS = [
    ("accuracy", "Accuracy (%)"),
    ("nll", "NLL"),
    ("ece", "ECE (20 bins)"),
    ("brier", "Brier"),
]
GEOMETRY_NOTE = (
    "Sharpness (the SAM loss increase) and the Hessian trace tr(H) of each predictor's "
    "weights: properties of the network, not averages over test points, so they carry no "
    "bootstrap interval."
)
NO_PAIRS = "No baseline/counterpart pairs among the predictors."
COMPARISONS_NOTE = (
    "One line per predictor. A difference counts only where its 95% paired bootstrap "
    "interval (the same test points resampled for both predictors) excludes 0: "
    "'improves X by d (95% CI lo-hi)' gives the gain, 'within noise (d ± h)' the "
    "difference and how far the interval reaches around it. Accuracy differences are in "
    "percentage points, with McNemar's exact p (only the images exactly one of the two "
    "gets right count)."
)


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


def _digits(metric: str) -> tuple[float, int, str]:
    """Scale, decimals and unit a metric's differences are written in."""
    return (100.0, 2, " pp") if metric == "accuracy" else (1.0, 4, "")


def fmt_value(metric: str, value: float) -> str:
    """A metric's value as the tables show it: accuracy in percent."""
    scale, digits, _ = _digits(metric)
    return f"{scale * value:.{digits}f}" if math.isfinite(value) else "n/a"


def with_interval(metric: str, value: float, estimate: Estimate | None) -> str:
    """``value [low, high]``, or the bare value when there is no interval."""
    if estimate is None:
        return fmt_value(metric, value)
    low, high = fmt_value(metric, estimate.low), fmt_value(metric, estimate.high)
    return f"{fmt_value(metric, estimate.value)} [{low}, {high}]"


def effect(interval: Interval, extra: str = "") -> str:
    """What a difference says: 'improves X by d (95% CI lo-hi)', 'worsens ...' or 'X
    within noise (d ± h)'; ``extra`` (McNemar's p) goes inside the brackets."""
    scale, digits, unit = _digits(interval.metric)
    label = _LABELS[interval.metric]
    more = f"; {extra}" if extra else ""
    verdict = interval.verdict()
    if verdict == "within noise":
        reach = scale * max(interval.high - interval.diff, interval.diff - interval.low)
        diff = scale * interval.diff
        return f"{label} within noise ({diff:+.{digits}f} ± {reach:.{digits}f}{unit}{more})"
    sign = -1.0 if LOWER_IS_BETTER[interval.metric] else 1.0
    if verdict == "worse":
        sign = -sign
    low, high = sorted((sign * scale * interval.low, sign * scale * interval.high))
    word = "improves" if verdict == "better" else "worsens"
    level = f"{100 * interval.level:g}% CI"
    return (
        f"{word} {label} by {sign * scale * interval.diff:.{digits}f}{unit} "
        f"({level} {low:.{digits}f}-{high:.{digits}f}{unit}{more})"
    )


def _effects(comp: Comparison, keys: tuple[str, ...] = tuple(_LABELS)) -> list[str]:
    """The effects in the order improves, worsens, within noise; accuracy with McNemar."""
    order = {"better": 0, "worse": 1, "within noise": 2}
    found = []
    for key in keys:
        interval = comp.intervals[key]
        extra = f"McNemar p = {comp.mcnemar_p:.2g}" if key == "accuracy" else ""
        found.append((order[interval.verdict()], effect(interval, extra)))
    return [text for _, text in sorted(found, key=lambda t: t[0])]


def _without_interval(ref: PredictorResult, cand: PredictorResult) -> str:
    parts = []
    for key, label in _LABELS.items():
        ours, theirs = cand.metric(key), ref.metric(key)
        if math.isfinite(ours) and math.isfinite(theirs):
            scale, digits, unit = _digits(key)
            parts.append(f"{label} {scale * (ours - theirs):+.{digits}f}{unit}")
    shown = ", ".join(parts) or "no metrics"
    return f"no per-point predictions, so no interval and no verdict ({shown})"


def comparison_line(ref: PredictorResult, cand: PredictorResult, comp: Comparison | None) -> str:
    """One line for a comparison: every metric's effect, improvements first."""
    body = "; ".join(_effects(comp)) if comp is not None else _without_interval(ref, cand)
    return f"{cand.name} vs {ref.name}: {body}."


def baseline_lines(inputs: ReportInputs, unc: Uncertainty) -> list[str]:
    """Each predictor against the baseline, in table order."""
    by_name = {p.name: p for p in inputs.predictors}
    base = by_name.get(inputs.baseline)
    if base is None:
        return [f"Baseline '{inputs.baseline}' is not among the predictors; no comparison made."]
    return [
        comparison_line(base, p, unc.comparison(base.name, p.name))
        for p in inputs.predictors
        if p is not base
    ]


def pair_lines(inputs: ReportInputs, unc: Uncertainty) -> list[str]:
    """Each counterpart against its reference (F-variant vs baseline, HWA vs VI)."""
    return [
        comparison_line(ref, cand, unc.comparison(ref.name, cand.name))
        for ref, cand in _valid_pairs(inputs)
    ]


def _pair_claim(
    paper: str,
    ref: PredictorResult,
    cand: PredictorResult,
    keys: tuple[str, ...],
    comp: Comparison | None,
) -> Claim:
    """Holds when every claimed metric improves, does not when one worsens, else undecided."""
    labels = [_LABELS[k] for k in keys]
    statement = f"{cand.name} improves on {ref.name} in {', '.join(labels[:-1])} and {labels[-1]}"
    if comp is None:
        return Claim(paper, statement, None, _without_interval(ref, cand))
    verdicts = {comp.intervals[k].verdict() for k in keys}
    holds = False if "worse" in verdicts else True if verdicts == {"better"} else None
    evidence = "; ".join(_effects(comp, keys))
    sharp, base = cand.metric("sharpness"), ref.metric("sharpness")
    if paper == FLAT_PAPER and math.isfinite(sharp) and math.isfinite(base):
        evidence += f"; sharpness {sharp:.4f} vs {base:.4f} (on the weights, no interval)"
    return Claim(paper, statement, holds, evidence)


def claims(inputs: ReportInputs, unc: Uncertainty) -> list[Claim]:
    """HWA vs its VI on accuracy, NLL and ECE; each F-variant vs its baseline on accuracy,
    NLL, ECE and Brier. Other pairs are compared but claim nothing."""
    found = []
    for ref, cand in _valid_pairs(inputs):
        if cand.method in REGISTRY and REGISTRY[cand.method].baseline == ref.method == "vi":
            paper, keys = HWA_PAPER, _HWA_CLAIMED
        elif cand.name in (f"f{ref.name}", f"f_{ref.name}"):
            paper, keys = FLAT_PAPER, _F_CLAIMED
        else:
            continue
        comp = unc.comparison(ref.name, cand.name)
        found.append(_pair_claim(paper, ref, cand, keys, comp))
    return found


def metrics_table(predictors: list[PredictorResult], unc: Uncertainty) -> Table:
    """Every metric with its 95% interval where predictions exist; the best value bold.

    The method is in the setup paragraph; leaving it out keeps four intervals on a line.
    """
    best = {}
    for key, _ in _COLUMNS:
        values = [v for p in predictors if math.isfinite(v := p.metric(key))]
        higher = not LOWER_IS_BETTER[key]
        best[key] = (max if higher else min)(values) if values else None
    header = ["Predictor", "Trajectory", "Scale", *(h for _, h in _COLUMNS), "Samples"]
    rows = []
    for p in predictors:
        row = [Cell(p.name), Cell(p.trajectory), Cell(f"{p.scale:g}")]
        for key, _ in _COLUMNS:
            v = p.metric(key)
            text = with_interval(key, v, unc.estimate(p.name, key))
            row.append(Cell(text, math.isfinite(v) and v == best[key]))
        n = p.metric("n_samples")
        row.append(Cell(f"{n:g}" if math.isfinite(n) else "n/a"))
        rows.append(row)
    return Table(header, rows)


def metrics_note(predictors: list[PredictorResult], unc: Uncertainty) -> str:
    """How to read the metrics table, and which predictors have no interval and why."""
    s = unc.settings
    text = (
        f"Each metric on the test split with its {100 * s.level:g}% percentile bootstrap "
        f"interval in brackets ({s.resamples} resamples of the test points, seed {s.seed}). "
        "Bold: the best value of the column, not necessarily better beyond noise (see "
        "Comparisons)."
    )
    missing = [p.name for p in predictors if not unc.estimates.get(p.name)]
    if missing:
        text += (
            f" No interval for {', '.join(missing)}: their per-point predictions "
            "(predictions/<name>.npz) were not given, so only the value is shown."
        )
    return text


def geometry_table(predictors: list[PredictorResult]) -> Table | None:
    """Sharpness and tr(H): properties of the weights, not of test points, so no interval."""
    keys = (("sharpness", "Sharpness (SAM)", ".4f"), ("hessian_trace", "tr(H)", ".3g"))
    rows = [
        [
            Cell(p.name),
            *(Cell(format(v, f) if math.isfinite(v := p.metric(k)) else "n/a") for k, _, f in keys),
        ]
        for p in predictors
        if any(math.isfinite(p.metric(k)) for k, _, _ in keys)
    ]
    return Table(["Predictor", *(h for _, h, _ in keys)], rows) if rows else None
