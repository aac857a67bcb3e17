"""How the DSWAG claims compare two predictors, and read a sweep's verdicts.

Intervals: DSWAG against its FedAvg model and against SWAG after distributed training is the
paired bootstrap of ALGORITHMS §10 (from ``uncertainty``) wherever both predictors' per-point
predictions are kept. Without them an accuracy difference gets an unpaired binomial 95%
interval; it is wider than the paired one whenever the two predictors err on the same points
(as related networks do), so "excludes 0" stays a safe statement, and NLL, ECE and Brier get
none. The sweep keeps metrics only, so it is always compared this way, and the sweep shows
whether a sign holds across W.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from ...formats import LABELS, diff_number, pct
from ...formats import signed as signed_number
from ...inputs import PredictorResult
from ...intervals import Interval
from ...stats import accuracy_interval
from ...uncertainty import Comparison

UNPAIRED = "no paired per-point predictions"


class Difference(NamedTuple):
    """``verdict``: 'better', 'worse', 'within noise', or None without an interval;
    ``text``: the evidence; ``number``: the difference and its interval, for a table cell."""

    verdict: str | None
    text: str
    number: str


def difference(
    metric: str,
    ours: float,
    theirs: float,
    interval: Interval | None,
    n: int | None = None,
    extra: str = "",
) -> Difference:
    """``ours - theirs`` with its interval.

    The paired ``interval`` where there is one; otherwise, for accuracy, the
    unpaired binomial one over ``n`` points; otherwise no verdict (None), and
    the text says why.
    """
    acc = metric == "accuracy"
    label = LABELS[metric]
    if not (math.isfinite(ours) and math.isfinite(theirs)):
        return Difference(None, f"{label} missing", f"{label} n/a (missing)")
    scale, digits, unit = (100.0, 2, " pp") if acc else (1.0, 4, "")

    def signed(v: float) -> str:
        return signed_number(scale * v, digits)

    values = f"{pct(ours)} vs {pct(theirs)}" if acc else f"{ours:.4f} vs {theirs:.4f}"
    text = f"{label} {values} ("
    if interval is not None:
        low, high, verdict = interval.low, interval.high, interval.verdict()
        level = f"{100 * interval.level:g}%"
        text += f"{signed(interval.diff)}{unit}, paired bootstrap {level} interval"
        diff = interval.diff
    elif acc and n:
        low, high = accuracy_interval(ours, theirs, n)
        verdict = "better" if low > 0 else "worse" if high < 0 else "within noise"
        text += f"{signed(ours - theirs)}{unit}, unpaired binomial 95% interval"
        extra, diff = UNPAIRED, ours - theirs
    else:
        why = "test size unknown" if acc else UNPAIRED
        text = f"{text}{signed(ours - theirs)}{unit}, no interval: {why})"
        return Difference(None, text, diff_number(metric, ours - theirs))
    text += f" {signed(low)} to {signed(high)}{unit}" + (f", {extra}" if extra else "")
    word = "higher" if low > 0 else "lower" if high < 0 else "includes 0, not shown to differ"
    return Difference(verdict, f"{text}: {word})", diff_number(metric, diff, low, high))


def compare(
    comp: Comparison | None,
    metric: str,
    cand: PredictorResult,
    ref: PredictorResult,
    n: int | None = None,
) -> Difference:
    """``difference`` of cand - ref, with the paired interval (and McNemar's p) if any."""
    interval = comp.intervals[metric] if comp is not None else None
    extra = f"McNemar p = {comp.mcnemar_p:.2g}" if comp is not None and metric == "accuracy" else ""
    return difference(metric, cand.metric(metric), ref.metric(metric), interval, n, extra)


def upper(text: str) -> str:
    """The text with its first letter upper-case, to open a sentence of evidence."""
    return text[:1].upper() + text[1:]


def sweep_holds(verdicts: Sequence[str]) -> bool | None:
    """A sweep claim from ``steps`` verdicts: True when every checked one holds at every
    step, False when every one does not hold, else (mixed, partial, unchecked) None."""
    checked = [v for v in verdicts if not v.startswith("cannot be checked")]
    if not checked:
        return None
    if all(v.startswith("holds at every step") for v in checked):
        return True
    if all(v.startswith("does not hold") for v in checked):
        return False
    return None
