"""How the report writes numbers: a metric's value, its interval, a difference, a win count.

Shared by the sections so that a metric reads the same in every table and sentence.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .inputs import PredictorResult
from .intervals import Estimate, Interval

# (metric key, label, higher is better, value format, delta format) for pair comparisons.
DELTAS: list[tuple[str, str, bool, Callable[[float], str], Callable[[float], str]]] = [
    ("accuracy", "accuracy", True, lambda v: f"{100 * v:.2f}", lambda d: f"{100 * d:+.2f}"),
    ("nll", "NLL", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("ece", "ECE", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("brier", "Brier", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("sharpness", "sharpness", False, lambda v: f"{v:.4f}", lambda d: f"{d:+.4f}"),
    ("hessian_trace", "tr(H)", False, lambda v: f"{v:.3g}", lambda d: f"{d:+.3g}"),
]


LABELS = {"accuracy": "accuracy", "nll": "NLL", "ece": "ECE", "brier": "Brier"}


def metric_scale(metric: str) -> tuple[float, int, str]:
    """Scale, decimals and unit a metric's differences are written in."""
    return (100.0, 2, " pp") if metric == "accuracy" else (1.0, 4, "")


def signed(value: float, digits: int = 4) -> str:
    """``value`` with its sign at ``digits`` decimals; a nonzero value those would write as
    ±0 gets the decimals of two significant digits instead: an interval's bound that
    decides a verdict ('worse': the low bound above 0) must not read as 0."""
    return _fixed(value, digits, "+")


def unsigned(value: float, digits: int = 4) -> str:
    """``signed`` without a plus sign (an effect's size, its interval's bounds)."""
    return _fixed(value, digits, "")


def _fixed(value: float, digits: int, sign: str) -> str:
    text = f"{value:{sign}.{digits}f}"
    if value == 0 or not math.isfinite(value) or float(text) != 0:
        return text
    decimals = min(12, 1 - math.floor(math.log10(abs(value))))
    return f"{value:{sign}.{decimals}f}"


def interval_text(value: float, low: float, high: float, digits: int = 4) -> str:
    """'+0.0123 [+0.0040, +0.0200]': a difference and its interval, each ``signed``."""
    return f"{signed(value, digits)} [{signed(low, digits)}, {signed(high, digits)}]"


def diff_number(
    metric: str, diff: float, low: float | None = None, high: float | None = None
) -> str:
    """A difference as a claim's deciding number: 'NLL diff -0.0123 [-0.0200, -0.0040]'
    (accuracy in pp), or '..., no CI' without an interval."""
    scale, digits, unit = metric_scale(metric)
    text = f"{LABELS.get(metric, metric)} diff {signed(scale * diff, digits)}{unit}"
    if low is None or high is None:
        return f"{text}, no CI"
    return f"{text} [{signed(scale * low, digits)}, {signed(scale * high, digits)}]"


def interval_number(interval: Interval) -> str:
    """``diff_number`` of a paired bootstrap interval."""
    return diff_number(interval.metric, interval.diff, interval.low, interval.high)


def fmt_value(metric: str, value: float) -> str:
    """A metric's value as the tables show it: accuracy in percent."""
    scale, digits, _ = metric_scale(metric)
    return f"{scale * value:.{digits}f}" if math.isfinite(value) else "n/a"


def with_interval(metric: str, value: float, estimate: Estimate | None) -> str:
    """``value [low, high]``, or the bare value when there is no interval."""
    if estimate is None:
        return fmt_value(metric, value)
    low, high = fmt_value(metric, estimate.low), fmt_value(metric, estimate.high)
    return f"{fmt_value(metric, estimate.value)} [{low}, {high}]"


def pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def fmt_or_dash(v: float, spec: str = ".4f", missing: str = "-") -> str:
    return format(v, spec) if math.isfinite(v) else missing


def _better(key: str, ours: float, theirs: float) -> bool:
    higher = next(h for k, _, h, _, _ in DELTAS if k == key)
    return ours > theirs if higher else ours < theirs


def win_count(cand: PredictorResult, ref: PredictorResult, keys: tuple[str, ...]) -> str:
    """Win count of ``cand`` over ``ref`` on ``keys``, with the numbers; ties are not wins."""
    wins, losses, missing, values = [], [], [], []
    for key, label, _, fmt, dfmt in DELTAS:
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
