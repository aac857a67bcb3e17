"""The DSWAG paper's claims (Kiriti, Tsai, Duncan; ALGORITHMS §8) as found on this run, one
``Claim`` per statement, (a) to (e). As everywhere in the report, a claim must be earned: ties
and missing values never count for it.

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

from ....intervals import Interval
from ...claims import DSWAG_PAPER, Claim
from ...formats import LABELS, pct, win_count
from ...inputs import PredictorResult, ReportInputs, SweepPoint
from ...sigma_curves import FLAT_TOLERANCE, flat_range
from ...stats import accuracy_interval
from ...uncertainty import Comparison, Uncertainty, compute
from .measures import (
    COLLAPSE_DROP,
    NO_VARIANCE,
    SWEEP_PREDICTORS,
    DswagRoles,
    accuracy_lower,
    confidence_text,
    dswag_roles,
    has_variance,
    m_text,
    mean_confidence,
    no_variance,
    point_curve,
    rounds_label,
    rounds_text,
    snapshots_text,
    steps,
    test_size,
    w_label,
)

_NLL_ACC = ("nll", "accuracy")


UNPAIRED = "no paired per-point predictions"


def _difference(
    metric: str,
    ours: float,
    theirs: float,
    interval: Interval | None,
    n: int | None = None,
    extra: str = "",
) -> tuple[str | None, str]:
    """``ours - theirs`` with its interval: ('better', 'worse' or 'within noise', text).

    The paired ``interval`` where there is one; otherwise, for accuracy, the
    unpaired binomial one over ``n`` points; otherwise no verdict (None), and
    the text says why.
    """
    acc = metric == "accuracy"
    label = LABELS[metric]
    if not (math.isfinite(ours) and math.isfinite(theirs)):
        return None, f"{label} missing"
    scale, digits, unit = (100.0, 2, " pp") if acc else (1.0, 4, "")

    def signed(v: float) -> str:
        return f"{scale * v:+.{digits}f}"

    values = f"{pct(ours)} vs {pct(theirs)}" if acc else f"{ours:.4f} vs {theirs:.4f}"
    text = f"{label} {values} ("
    if interval is not None:
        low, high, verdict = interval.low, interval.high, interval.verdict()
        level = f"{100 * interval.level:g}%"
        text += f"{signed(interval.diff)}{unit}, paired bootstrap {level} interval"
    elif acc and n:
        low, high = accuracy_interval(ours, theirs, n)
        verdict = "better" if low > 0 else "worse" if high < 0 else "within noise"
        text += f"{signed(ours - theirs)}{unit}, unpaired binomial 95% interval"
        extra = UNPAIRED
    else:
        why = "test size unknown" if acc else UNPAIRED
        return None, f"{text}{signed(ours - theirs)}{unit}, no interval: {why})"
    text += f" {signed(low)} to {signed(high)}{unit}" + (f", {extra}" if extra else "")
    word = "higher" if low > 0 else "lower" if high < 0 else "includes 0, not shown to differ"
    return verdict, f"{text}: {word})"


def _compare(
    comp: Comparison | None,
    metric: str,
    cand: PredictorResult,
    ref: PredictorResult,
    n: int | None = None,
) -> tuple[str | None, str]:
    """``_difference`` of cand - ref, with the paired interval (and McNemar's p) if any."""
    interval = comp.intervals[metric] if comp is not None else None
    extra = f"McNemar p = {comp.mcnemar_p:.2g}" if comp is not None and metric == "accuracy" else ""
    return _difference(metric, cand.metric(metric), ref.metric(metric), interval, n, extra)


def _upper(text: str) -> str:
    """The text with its first letter upper-case, to open a sentence of evidence."""
    return text[:1].upper() + text[1:]


def _holds(verdicts: Sequence[str]) -> bool | None:
    """A sweep claim from ``_steps`` verdicts: True when every checked one holds at every
    step, False when every one does not hold, else (mixed, partial, unchecked) None."""
    checked = [v for v in verdicts if not v.startswith("cannot be checked")]
    if not checked:
        return None
    if all(v.startswith("holds at every step") for v in checked):
        return True
    if all(v.startswith("does not hold") for v in checked):
        return False
    return None


def _claim_b(inputs: ReportInputs, roles: DswagRoles | None, unc: Uncertainty) -> Claim:
    """On the dswag trajectory: holds when NLL is lower and accuracy shown higher, does
    not when neither; paired intervals decide both where there are predictions."""
    statement = "(b) DSWAG improves on its own FedAvg model (NLL, accuracy)"
    if roles is None or roles.dswag is None or roles.fedavg is None:
        why = "Cannot be checked: no DSWAG and FedAvg predictors on a dswag trajectory."
        return Claim(DSWAG_PAPER, statement, None, why)
    d, f = roles.dswag, roles.fedavg
    comp = unc.comparison(f.name, d.name)
    nll, nll_text = _compare(comp, "nll", d, f)
    acc, acc_text = _compare(comp, "accuracy", d, f, test_size(inputs, d))
    ours, theirs = d.metric("nll"), f.metric("nll")
    if not (math.isfinite(ours) and math.isfinite(theirs)):
        return Claim(DSWAG_PAPER, statement, None, f"{d.name} vs {f.name}: {nll_text}; {acc_text}.")
    nll_better = nll == "better" if comp is not None else ours < theirs
    shown = acc == "better"
    holds = True if nll_better and shown else False if not (nll_better or shown) else None
    verdict = {True: "holds", False: "does not hold"}.get(holds) or (
        "holds for NLL only" if nll_better else "holds for accuracy only"
    )
    evidence = (
        f"{_upper(verdict)} on trajectory {roles.trajectory} ({d.name} vs {f.name}): "
        f"{nll_text}; {acc_text}."
    )
    return Claim(DSWAG_PAPER, statement, holds, evidence)


def _claim_b_sweep(inputs: ReportInputs) -> Claim | None:
    """(b) at each W of the sweep (unpaired: the sweep keeps no per-point predictions):
    holds when it holds at every W, does not when at none is NLL lower or accuracy shown."""
    if not inputs.dswag_sweep:
        return None
    statement = "(b') DSWAG improves on FedAvg (NLL, accuracy) at every worker count of the sweep"
    rows = [
        p
        for p in inputs.dswag_sweep
        if all(math.isfinite(p.metric(k, m)) for k in ("dswag", "fedavg") for m in _NLL_ACC)
    ]
    parts, holds = [], None
    if rows:
        n = test_size(inputs)
        nll = [p for p in rows if p.metric("dswag", "nll") < p.metric("fedavg", "nll")]
        acc = [p for p in rows if p.metric("dswag", "accuracy") > p.metric("fedavg", "accuracy")]
        shown = [p for p in rows if n and accuracy_lower(p, "dswag", "fedavg", n) > 0]
        deltas = ", ".join(
            f"{w_label(p)} {p.metric('dswag', 'nll') - p.metric('fedavg', 'nll'):+.4f}"
            for p in rows
        )
        parts.append(
            f"DSWAG's NLL is lower than FedAvg's at {len(nll)} of {len(rows)} worker counts "
            f"(DSWAG - FedAvg: {deltas}); its accuracy is higher at {len(acc)} of {len(rows)}, "
            f"with the unpaired binomial 95% interval excluding 0 at {len(shown)}"
            + (f" ({', '.join(w_label(p) for p in shown)})" if shown else "")
            + " (the sweep keeps no per-point predictions)"
        )
        both = [p for p in nll if p in shown]
        holds = True if len(both) == len(rows) else False if not (nll or shown) else None
    skipped = [p for p in inputs.dswag_sweep if no_variance(p)]
    if skipped:
        listed = ", ".join(f"{w_label(p)} ({snapshots_text(p)})" for p in skipped)
        parts.append(f"no DSWAG at {listed}: {NO_VARIANCE}")
    if not rows:
        why = "cannot be checked: no worker count has DSWAG's and FedAvg's NLL and accuracy"
        parts.insert(0, why)
    text = "; ".join(parts)
    return Claim(DSWAG_PAPER, statement, holds, _upper(text) + ".")


def _claim_c(inputs: ReportInputs, roles: DswagRoles, unc: Uncertainty) -> list[Claim]:
    """Against SWAG after distributed training: decided by ECE (by its paired interval
    where there are predictions, else by the values); then the paper's 'more confident'."""
    statement = (
        "(c) DSWAG is better calibrated than SWAG after distributed training, and comparable "
        "to it (the paper's Fig. 5 right and conclusion)"
    )
    if roles.dswag is None or roles.baseline is None:
        why = (
            "Cannot be checked: needs a swag predictor on the dswag trajectory and one on a "
            "trajectory that starts from it."
        )
        return [Claim(DSWAG_PAPER, statement, None, why)]
    d, b = roles.dswag, roles.baseline
    keys = ("ece", "nll", "accuracy", "brier")
    if not all(math.isfinite(p.metric(k)) for p in (d, b) for k in ("ece", "nll")):
        found = [Claim(DSWAG_PAPER, statement, None, win_count(d, b, keys) + ".")]
    else:
        comp = unc.comparison(b.name, d.name)
        n = test_size(inputs, d)
        diffs = {k: _compare(comp, k, d, b, n) for k in keys}
        if comp is None:
            calibrated: bool | None = d.metric("ece") < b.metric("ece")
        else:
            calibrated = {"better": True, "worse": False}.get(diffs["ece"][0] or "")
        phrase = {True: "holds", False: "does not hold", None: "is not shown"}[calibrated]
        evidence = (
            f"{d.name} vs {b.name}: better calibration {phrase}; "
            + "; ".join(text for _, text in diffs.values())
            + "."
        )
        found = [Claim(DSWAG_PAPER, statement, calibrated, evidence)]
    conf = [mean_confidence(p) for p in (d, b)]
    if conf[0] is not None and conf[1] is not None:
        found.append(
            Claim(
                DSWAG_PAPER,
                "(c') DSWAG gives more confident predictions than SWAG (the paper's conclusion)",
                conf[0][0] > conf[1][0],
                f"{confidence_text(d)}; {confidence_text(b)}.",
            )
        )
    return found


def _claim_a(sweep: list[SweepPoint]) -> list[Claim]:
    if not sweep:
        return []
    target = sweep[0].target_accuracy
    values = [math.inf if p.rounds_to_target is None else float(p.rounds_to_target) for p in sweep]
    verdict, _ = steps(sweep, values, True, rounds_text, ("more", "fewer"))
    listing = ", ".join(f"{w_label(p)} {rounds_label(p)}" for p in sweep)
    rounds = Claim(
        DSWAG_PAPER,
        "(a) More workers need more phase-1 rounds to reach the target (the paper's Fig. 5 left)",
        _holds([verdict]),
        f"Rounds until the global model's train accuracy >= {pct(target)}: {listing}; {verdict}.",
    )
    final = [p.metric("fedavg", "accuracy") for p in sweep]
    verdict, listing = steps(sweep, final, False, pct)
    ending = Claim(
        DSWAG_PAPER,
        "(a') With more workers phase 1 ends at a lower test accuracy (the paper: 'reaches "
        "suboptimal solutions')",
        _holds([verdict]),
        f"FedAvg model's test accuracy: {listing}; {verdict}.",
    )
    return [rounds, ending]


def _at_each_w(holding: list[SweepPoint], varied: int) -> tuple[str, bool | None]:
    """Verdict of a claim checked at each of ``varied`` worker counts with a variance,
    holding at ``holding``: everywhere, at some only (undecided), or nowhere."""
    if not varied:
        return "cannot be checked: no worker count has a variance", None
    if len(holding) == varied:
        return "holds at every W with a variance", True
    if holding:
        return f"holds at {', '.join(w_label(p) for p in holding)} only", None
    return "does not hold at any W", False


def _claim_d(sweep: list[SweepPoint]) -> list[Claim]:
    curves = [(p, c) for p in sweep if (c := point_curve(p)) is not None]
    if not curves:
        return []
    varied = [(p, c) for p, c in curves if has_variance(p, c)]
    flat_m = [p for p, c in varied if (r := flat_range(c)) is not None and r > 0]
    top = curves[0][1].multiples[-1]
    collapsed = [p for p, c in varied if c.mean[-1] < c.mean[0] - COLLAPSE_DROP]
    per_w = "; ".join(
        f"{w_label(p)} within {100 * FLAT_TOLERANCE:g} pp of {pct(c.mean[0])} up to "
        f"{m_text(flat_range(c))}, {pct(c.mean[-1])} at m = {c.multiples[-1]:g} "
        f"(||sigma|| {c.sigma_norm:.3g})"
        for p, c in varied
    )
    both = [p for p in flat_m if p in collapsed]
    verdict, holds = _at_each_w(both, len(varied))
    evidence = _upper(verdict) + (f": {per_w}." if per_w else ".")
    flat = [p for p, c in curves if not has_variance(p, c)]
    if flat:
        listed = ", ".join(f"{w_label(p)} ({snapshots_text(p)})" for p in flat)
        evidence += (
            f" Left out: {listed}: {NO_VARIANCE}; sigma = 0 and theta_bar + m * sigma * z "
            "is theta_bar for every m."
        )
    found = [
        Claim(
            DSWAG_PAPER,
            f"(d) The accuracy of the single network theta_bar + m * sigma * z stays within "
            f"{100 * FLAT_TOLERANCE:g} pp of theta_bar's for small m (m >= 1) and collapses "
            f"(falls more than {100 * COLLAPSE_DROP:g} pp) for large m",
            holds,
            evidence,
        )
    ]
    still_flat = [p for p, c in varied if (r := flat_range(c)) is not None and r >= top]
    flat_text, holds = _at_each_w(still_flat, len(varied))
    reaches = ", ".join(f"{w_label(p)} {m_text(flat_range(c))}" for p, c in varied)
    found.append(
        Claim(
            DSWAG_PAPER,
            "(d') The paper's Fig. 6: accuracy stays almost flat up to m = 100"
            + ("" if top == 100 else f" (here up to m = {top:g})"),
            holds,
            _upper(flat_text)
            + (
                f"; within {100 * FLAT_TOLERANCE:g} pp of m = 0 up to: {reaches}."
                if reaches
                else "."
            ),
        )
    )
    reach = [float(r) if (r := flat_range(c)) is not None else math.nan for _, c in varied]
    verdict, listing = steps([p for p, _ in varied], reach, False, m_text)
    distance = [r * c.sigma_norm for r, (_, c) in zip(reach, varied, strict=True)]
    far_verdict, far_listing = steps([p for p, _ in varied], distance, False, lambda v: f"{v:.3g}")
    at_top = [c.mean[-1] for _, c in varied]
    top_verdict, top_listing = steps([p for p, _ in varied], at_top, False, pct)
    found.append(
        Claim(
            DSWAG_PAPER,
            "(d'') More workers, less robust to the perturbation (the paper: 'as we increase "
            "the number of workers, the performance drops')",
            _holds([verdict, far_verdict, top_verdict]),
            f"By the multiple m up to which the accuracy stays within "
            f"{100 * FLAT_TOLERANCE:g} pp: {verdict} ({listing}). By that range as a distance "
            f"m ||sigma|| from theta_bar (sigma differs by W, so the same m is a different "
            f"distance): {far_verdict} ({far_listing}). By the accuracy at m = {top:g}: "
            f"{top_verdict} ({top_listing}).",
        )
    )
    return found


def _claim_e(sweep: list[SweepPoint]) -> list[Claim]:
    if not sweep:
        return []
    parts, verdicts = [], []
    for key, label in reversed(SWEEP_PREDICTORS):
        values = [p.metric(key, "nll") for p in sweep]
        verdict, listing = steps(sweep, values, True, lambda v: f"{v:.4f}")
        parts.append(f"{label}: {verdict} ({listing or 'no values'})")
        verdicts.append(verdict)
    missing = [p for p in sweep if p.metrics.get("dswag") is None]
    note = (
        f"; DSWAG has no value at {', '.join(w_label(p) for p in missing)} ({NO_VARIANCE})"
        if missing
        else ""
    )
    return [
        Claim(
            DSWAG_PAPER,
            "(e) The test NLL increases with the number of workers (the paper's Fig. 7, MNIST)",
            _holds(verdicts),
            "; ".join(parts) + note + ".",
        )
    ]


def claims(inputs: ReportInputs, unc: Uncertainty | None = None) -> list[Claim]:
    """One claim per statement of the paper, in the order (a) to (e); empty without data.

    ``unc``: the report's intervals; without it they come from ``compute``,
    which computes them once per inputs.
    """
    roles = dswag_roles(inputs)
    found = _claim_a(inputs.dswag_sweep)
    if roles is not None or inputs.dswag_sweep:
        unc = unc if unc is not None else compute(inputs)
        found.append(_claim_b(inputs, roles, unc))
        sweep = _claim_b_sweep(inputs)
        found += [sweep] if sweep is not None else []
        if roles is not None:
            found += _claim_c(inputs, roles, unc)
    return found + _claim_d(inputs.dswag_sweep) + _claim_e(inputs.dswag_sweep)
