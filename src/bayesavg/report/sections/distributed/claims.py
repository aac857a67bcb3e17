"""The DSWAG paper's claims (Kiriti, Tsai, Duncan; ALGORITHMS §8) as found on this run, one
``Claim`` per statement, (a) to (e). As everywhere in the report, a claim must be earned: ties
and missing values never count for it.

Intervals: see ``differences``.
"""

from __future__ import annotations

import math

from ...claims import DSWAG_PAPER, Claim
from ...formats import interval_text, pct, win_count
from ...inputs import PredictorResult, ReportInputs, SweepPoint
from ...sigma_curves import FLAT_TOLERANCE, SigmaCurve, flat_range
from ...uncertainty import Uncertainty, compute
from .differences import compare, sweep_holds, upper
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


def _claim_b(inputs: ReportInputs, roles: DswagRoles | None, unc: Uncertainty) -> Claim:
    """On the dswag trajectory: holds when NLL is lower and accuracy shown higher, does
    not when neither; paired intervals decide both where there are predictions."""
    statement = "(b) DSWAG improves on its own FedAvg model (NLL, accuracy)"
    if roles is None or roles.dswag is None or roles.fedavg is None:
        why = "Cannot be checked: no DSWAG and FedAvg predictors on a dswag trajectory."
        return Claim(DSWAG_PAPER, statement, None, why, "n/a (no DSWAG and FedAvg)")
    d, f = roles.dswag, roles.fedavg
    comp = unc.comparison(f.name, d.name)
    nll = compare(comp, "nll", d, f)
    acc = compare(comp, "accuracy", d, f, test_size(inputs, d))
    nll_text, acc_text, number = nll.text, acc.text, f"{nll.number}; {acc.number}"
    ours, theirs = d.metric("nll"), f.metric("nll")
    if not (math.isfinite(ours) and math.isfinite(theirs)):
        why = f"{d.name} vs {f.name}: {nll_text}; {acc_text}."
        return Claim(DSWAG_PAPER, statement, None, why, number)
    nll_better = nll.verdict == "better" if comp is not None else ours < theirs
    shown = acc.verdict == "better"
    holds = True if nll_better and shown else False if not (nll_better or shown) else None
    verdict = {True: "holds", False: "does not hold"}.get(holds) or (
        "holds for NLL only" if nll_better else "holds for accuracy only"
    )
    evidence = (
        f"{upper(verdict)} on trajectory {roles.trajectory} ({d.name} vs {f.name}): "
        f"{nll_text}; {acc_text}."
    )
    return Claim(DSWAG_PAPER, statement, holds, evidence, number)


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
    parts, holds, number = [], None, "n/a (no W has both predictors)"
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
        number = f"NLL lower at {len(nll)}, accuracy shown higher at {len(shown)} of {len(rows)} W"
        holds = True if len(both) == len(rows) else False if not (nll or shown) else None
    skipped = [p for p in inputs.dswag_sweep if no_variance(p)]
    if skipped:
        listed = ", ".join(f"{w_label(p)} ({snapshots_text(p)})" for p in skipped)
        parts.append(f"no DSWAG at {listed}: {NO_VARIANCE}")
    if not rows:
        why = "cannot be checked: no worker count has DSWAG's and FedAvg's NLL and accuracy"
        parts.insert(0, why)
    text = "; ".join(parts)
    return Claim(DSWAG_PAPER, statement, holds, upper(text) + ".", number)


def _claim_c(inputs: ReportInputs, roles: DswagRoles, unc: Uncertainty) -> list[Claim]:
    """Against SWAG after distributed training: decided by ECE (by its paired interval
    where there are predictions, else by the values); then the paper's 'more confident'."""
    statement = (
        "(c) DSWAG is better calibrated (lower ECE) than SWAG after distributed training "
        "(the paper's Fig. 5 right and conclusion)"
    )
    if roles.dswag is None or roles.baseline is None:
        why = (
            "Cannot be checked: needs a swag predictor on the dswag trajectory and one on a "
            "trajectory that starts from it."
        )
        return [Claim(DSWAG_PAPER, statement, None, why, "n/a (no DSWAG and SWAG baseline)")]
    d, b = roles.dswag, roles.baseline
    keys = ("ece", "nll", "accuracy", "brier")
    if not all(math.isfinite(p.metric(k)) for p in (d, b) for k in ("ece", "nll")):
        evidence = win_count(d, b, keys) + "."
        found = [Claim(DSWAG_PAPER, statement, None, evidence, "n/a (ECE or NLL missing)")]
    else:
        comp = unc.comparison(b.name, d.name)
        n = test_size(inputs, d)
        diffs = {k: compare(comp, k, d, b, n) for k in keys}
        if comp is None:
            calibrated: bool | None = d.metric("ece") < b.metric("ece")
        else:
            calibrated = {"better": True, "worse": False}.get(diffs["ece"].verdict or "")
        phrase = {True: "holds", False: "does not hold", None: "is not shown"}[calibrated]
        evidence = (
            f"{d.name} vs {b.name}: better calibration {phrase}; "
            + "; ".join(diff.text for diff in diffs.values())
            + "."
        )
        found = [Claim(DSWAG_PAPER, statement, calibrated, evidence, diffs["ece"].number)]
    confident = _claim_confident(d, b, unc)
    return found if confident is None else [*found, confident]


def _claim_confident(d: PredictorResult, b: PredictorResult, unc: Uncertainty) -> Claim | None:
    """The paper's 'more confident': DSWAG's mean confidence (largest averaged probability)
    against SWAG's, decided by its paired interval where there are predictions (within
    it: undecided), else by the values."""
    conf = [mean_confidence(p) for p in (d, b)]
    if conf[0] is None or conf[1] is None:
        return None
    number = f"mean confidence {pct(conf[0][0])} vs {pct(conf[1][0])}"
    evidence = f"{confidence_text(d, unc)}; {confidence_text(b, unc)}"
    iv = unc.paired(b.name, d.name, "confidence")
    holds: bool | None = conf[0][0] > conf[1][0]
    if iv is None:
        evidence += "; no per-point predictions, so no interval: decided by the values"
    else:
        holds = {"better": True, "worse": False}.get(iv.verdict())
        shown = interval_text(100 * iv.diff, 100 * iv.low, 100 * iv.high, 2)
        level = f"{100 * iv.level:g}%"
        number += f" (diff {shown} pp)"
        evidence += f"; difference {shown} pp, paired bootstrap {level} interval" + (
            "" if holds is not None else ", which holds 0: not shown to differ"
        )
    statement = "(c') DSWAG gives more confident predictions than SWAG (the paper's conclusion)"
    return Claim(DSWAG_PAPER, statement, holds, evidence + ".", number)


def _rounds(point: SweepPoint) -> str:
    """Rounds to the target, or '> rounds run' when it was not reached."""
    return f"> {point.rounds}" if point.rounds_to_target is None else str(point.rounds_to_target)


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
        sweep_holds([verdict]),
        f"Rounds until the global model's train accuracy >= {pct(target)}: {listing}; {verdict}.",
        "rounds to target: " + ", ".join(f"{w_label(p)} {_rounds(p)}" for p in sweep),
    )
    final = [p.metric("fedavg", "accuracy") for p in sweep]
    verdict, listing = steps(sweep, final, False, pct)
    ending = Claim(
        DSWAG_PAPER,
        "(a') With more workers phase 1 ends at a lower test accuracy (the paper: 'reaches "
        "suboptimal solutions')",
        sweep_holds([verdict]),
        f"FedAvg model's test accuracy: {listing}; {verdict}.",
        f"test accuracy {listing}" if listing else "n/a (no FedAvg test accuracy)",
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


def _at_count(
    holding: list[SweepPoint], varied: list[tuple[SweepPoint, SigmaCurve]], what: str
) -> str:
    """The deciding number of a claim checked at each W with a variance: at how many."""
    if not varied:
        return "n/a (no W with a variance)"
    return f"{what} at {len(holding)} of {len(varied)} W"


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
    evidence = upper(verdict) + (f": {per_w}." if per_w else ".")
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
            f"{100 * FLAT_TOLERANCE:g} pp of theta_bar's at small m (at least up to the "
            f"grid's first m > 0) and collapses (falls more than {100 * COLLAPSE_DROP:g} pp) "
            f"by the largest m (m = {top:g})",
            holds,
            evidence,
            _at_count(both, varied, "flat, then collapses"),
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
            upper(flat_text)
            + (
                f"; within {100 * FLAT_TOLERANCE:g} pp of m = 0 up to: {reaches}."
                if reaches
                else "."
            ),
            _at_count(still_flat, varied, f"flat to m = {top:g}"),
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
            sweep_holds([verdict, far_verdict, top_verdict]),
            f"By the multiple m up to which the accuracy stays within "
            f"{100 * FLAT_TOLERANCE:g} pp: {verdict} ({listing}). By that range as a distance "
            f"m ||sigma|| from theta_bar (sigma differs by W, so the same m is a different "
            f"distance): {far_verdict} ({far_listing}). By the accuracy at m = {top:g}: "
            f"{top_verdict} ({top_listing}).",
            f"flat up to: {listing}" if listing else "n/a (no W with a variance)",
        )
    )
    return found


def _claim_e(sweep: list[SweepPoint]) -> list[Claim]:
    if not sweep:
        return []
    parts, verdicts, ends = [], [], []
    for key, label in reversed(SWEEP_PREDICTORS):
        values = [p.metric(key, "nll") for p in sweep]
        verdict, listing = steps(sweep, values, True, lambda v: f"{v:.4f}")
        parts.append(f"{label}: {verdict} ({listing or 'no values'})")
        verdicts.append(verdict)
        known = [(p, v) for p, v in zip(sweep, values, strict=True) if math.isfinite(v)]
        if len(known) >= 2:
            (first, a), (last, b) = known[0], known[-1]
            span = first is not sweep[0] or last is not sweep[-1]
            ends.append(
                f"{label} {a:.4f} → {b:.4f}"
                + (f" ({w_label(first)} → {w_label(last)})" if span else "")
            )
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
            sweep_holds(verdicts),
            "; ".join(parts) + note + ".",
            f"NLL {w_label(sweep[0])} → {w_label(sweep[-1])}: " + ", ".join(ends)
            if ends
            else "n/a (fewer than 2 W with NLL)",
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
