"""Comparisons: every predictor against the baseline, every counterpart against its
reference, and the pair claims (HWA against its VI, each F-variant against its baseline).

A counterpart "improves" only where the 95% paired interval of the difference excludes 0;
otherwise it is "within noise", and without per-point predictions there is no verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ...config.methods import REGISTRY
from ..blocks import (
    Heading,
    Paragraph,
    Section,
    bullets_or,
)
from ..claims import FLAT_PAPER, HWA_PAPER, Claim
from ..formats import LABELS, diff_number, interval_number, metric_scale, signed, unsigned
from ..inputs import PredictorResult, ReportInputs
from ..intervals import LOWER_IS_BETTER, Interval
from ..uncertainty import Comparison, Uncertainty

_HWA_CLAIMED = ("accuracy", "nll", "ece")


_F_CLAIMED = ("accuracy", "nll", "ece", "brier")


NO_PAIRS = "No baseline/counterpart pairs among the predictors."


COMPARISONS_NOTE = (
    "One line per predictor. A difference counts only where its 95% paired bootstrap "
    "interval (the same test points resampled for both predictors) excludes 0: "
    "'improves X by d (95% CI lo-hi)' gives the gain, 'within noise (d, 95% CI lo to hi)' "
    "the difference and its interval, which holds 0. Every difference gets the percentile "
    "interval, ECE's too (ALGORITHMS §10): binned ECE's bootstrap sits higher for the "
    "better calibrated of two predictors, so an ECE improvement's interval leans towards "
    "0 (conservative) and may even leave its point outside. Accuracy differences are in "
    "percentage points, with McNemar's exact p (only the images exactly one of the two "
    "gets right count). Each interval is one comparison's, not corrected for how many "
    "there are (the headline gives the Holm-corrected counts)."
)


def pair_predictors(
    predictors: Mapping[str, tuple[str, str]], starts: Mapping[str, str]
) -> list[tuple[str, str]]:
    """(reference, candidate) pairs: each F-variant beside its baseline, HWA beside VI, a
    temperature-scaled predictor beside the one it scales.

    ``predictors`` maps a name to (method, trajectory), ``starts`` a
    trajectory to the one it starts from. ``f<base>``, ``f_<base>`` or
    ``<base>_ts`` pairs with ``<base>`` by name; a predictor whose method has a registry
    ``baseline`` (hwa: vi) pairs with each predictor of that method on its
    trajectory's start trajectory (the VI solution HWA continues from).
    Candidates keep the given order.
    """
    pairs: list[tuple[str, str]] = []
    for name, (method, trajectory) in predictors.items():
        flat = name[2:] if name.startswith("f_") else name[1:] if name.startswith("f") else ""
        bases = (name.removesuffix("_ts"), flat)
        found = [base for base in bases if base in predictors and base != name]
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


def effect(interval: Interval, extra: str = "") -> str:
    """What a difference says: 'improves X by d (95% CI lo-hi)', 'worsens ...' or 'X
    within noise (d, 95% CI lo to hi)'; ``extra`` (McNemar's p) goes inside the brackets."""
    scale, digits, unit = metric_scale(interval.metric)
    label = LABELS[interval.metric]
    more = f"; {extra}" if extra else ""
    verdict = interval.verdict()
    if interval.diff == interval.low == interval.high == 0:
        return f"{label} the same (no difference in any resample)"
    if verdict == "within noise":
        level = f"{100 * interval.level:g}% CI"
        low, high = (signed(scale * v, digits) for v in (interval.low, interval.high))
        diff = signed(scale * interval.diff, digits)
        return f"{label} within noise ({diff}{unit}, {level} {low} to {high}{unit}{more})"
    sign = -1.0 if LOWER_IS_BETTER[interval.metric] else 1.0
    if verdict == "worse":
        sign = -sign
    low, high = sorted((sign * scale * interval.low, sign * scale * interval.high))
    word = "improves" if verdict == "better" else "worsens"
    level = f"{100 * interval.level:g}% CI"
    return (
        f"{word} {label} by {unsigned(sign * scale * interval.diff, digits)}{unit} "
        f"({level} {unsigned(low, digits)}-{unsigned(high, digits)}{unit}{more})"
    )


def _effects(comp: Comparison, keys: tuple[str, ...] = tuple(LABELS)) -> list[str]:
    """The effects in the order improves, worsens, within noise; accuracy with McNemar."""
    order = {"better": 0, "worse": 1, "within noise": 2}
    found = []
    for key in keys:
        interval = comp.intervals[key]
        extra = f"McNemar p = {comp.mcnemar_p:.2g}" if key == "accuracy" else ""
        k = comp.nll_carried_by
        if key == "nll" and k is not None and interval.verdict() != "within noise":
            carry = f"{k} test images carry" if k != 1 else "1 test image carries"
            extra = f"{carry} it: without {'them' if k != 1 else 'it'} it is gone"
        found.append((order[interval.verdict()], effect(interval, extra)))
    return [text for _, text in sorted(found, key=lambda t: t[0])]


def _without_interval(ref: PredictorResult, cand: PredictorResult) -> str:
    parts = []
    for key, label in LABELS.items():
        ours, theirs = cand.metric(key), ref.metric(key)
        if math.isfinite(ours) and math.isfinite(theirs):
            scale, digits, unit = metric_scale(key)
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
    labels = [LABELS[k] for k in keys]
    statement = f"{cand.name} improves on {ref.name} in {', '.join(labels[:-1])} and {labels[-1]}"
    if comp is None:
        diffs = [(k, d) for k in keys if math.isfinite(d := cand.metric(k) - ref.metric(k))]
        number = diff_number(*diffs[0]) if diffs else "n/a (no metrics)"
        return Claim(paper, statement, None, _without_interval(ref, cand), number)
    verdicts = [comp.intervals[k].verdict() for k in keys]
    holds = False if "worse" in verdicts else True if set(verdicts) == {"better"} else None
    evidence = "; ".join(_effects(comp, keys))
    sharp, base = cand.metric("sharpness"), ref.metric("sharpness")
    if paper == FLAT_PAPER and math.isfinite(sharp) and math.isfinite(base):
        evidence += f"; sharpness {sharp:.4f} vs {base:.4f} (on the weights, no interval)"
    # The metric that decides: the first worse one, else the first within noise, else the first.
    want = {False: "worse", None: "within noise", True: "better"}[holds]
    deciding = comp.intervals[keys[verdicts.index(want)]]
    better = [LABELS[k] for k, v in zip(keys, verdicts, strict=True) if v == "better"]
    which = f": {', '.join(better)}" if better and len(better) < len(keys) else ""
    number = f"{interval_number(deciding)} ({len(better)} of {len(keys)} better{which})"
    return Claim(paper, statement, holds, evidence, number)


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


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    """Every predictor against the baseline, then every counterpart against its reference;
    the pair claims go to the headline."""
    blocks = [
        Heading(2, "Comparisons"),
        Paragraph(COMPARISONS_NOTE),
        Heading(3, f"Against the baseline {inputs.baseline}"),
        bullets_or(baseline_lines(inputs, unc), "No other predictor."),
        Heading(3, "Counterparts against their references"),
        bullets_or(pair_lines(inputs, unc), NO_PAIRS),
    ]
    return Section(blocks, claims(inputs, unc))
