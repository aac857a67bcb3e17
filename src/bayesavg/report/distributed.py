"""The DSWAG paper's claims (Kiriti, Tsai, Duncan; ALGORITHMS §8) as found on this run.

Pure over the input dataclasses and the report's intervals, like
``findings``: which predictors play DSWAG's roles, the worker sweep's
tables, and one ``Claim`` per statement of the paper that says whether it
holds here, with the numbers. As in ``findings``, a claim must be earned:
ties and missing values never count for it.

Intervals: DSWAG against its FedAvg model and against SWAG after
distributed training is the paired bootstrap of ALGORITHMS §10 (from
``uncertainty``) wherever both predictors' per-point predictions are kept.
Without them an accuracy difference gets an unpaired binomial 95% interval;
it is wider than the paired one whenever the two predictors err on the same
points (as related networks do), so "excludes 0" stays a safe statement,
and NLL, ECE and Brier get none. The sweep keeps metrics only, so it is
always compared this way, and the sweep shows whether a sign holds across W.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..intervals import Interval
from .claims import Claim
from .findings import Cell, Table, _claim
from .inputs import PredictorResult, ReportInputs, SweepPoint, trajectory_params
from .uncertainty import Comparison, Uncertainty, compute, settings

PAPER = "DSWAG (Kiriti, Tsai, Duncan)"
# Fig. 6: accuracy within this much of theta_bar's "stays high"; this much lower "collapses".
FLAT_TOLERANCE = 0.01
COLLAPSE_DROP = 0.10
_Z95 = 1.959963984540054
# The sweep's predictors in the metrics JSON, with their labels.
SWEEP_PREDICTORS = (("fedavg", "FedAvg"), ("dswa", "DSWA"), ("dswag", "DSWAG"))
_NLL_ACC = ("nll", "accuracy")
NO_VARIANCE = "fewer than 2 snapshots, so no variance"
UNPAIRED = "no paired per-point predictions"
_LABELS = {"accuracy": "accuracy", "nll": "NLL", "ece": "ECE", "brier": "Brier"}
SIGN_NOTE = (
    "Accuracy - confidence > 0 means under-confident (right more often than claimed), "
    "< 0 over-confident. The paper's text states the opposite; that sign is backwards."
)


class DswagRoles(NamedTuple):
    """The predictors of a kind-dswag trajectory, and the paper's baseline beside them.

    ``baseline``: a swag predictor on a (non-dswag) trajectory that starts
    from the dswag trajectory, i.e. SWAG after distributed training.
    """

    trajectory: str
    fedavg: PredictorResult | None
    dswa: PredictorResult | None
    dswag: PredictorResult | None
    baseline: PredictorResult | None


def dswag_roles(inputs: ReportInputs) -> DswagRoles | None:
    """The roles, found by trajectory kind, start and method, never by predictor name.

    Of several dswag trajectories, the first with both a DSWAG predictor and
    a baseline wins; None when no dswag trajectory has a predictor.
    """
    trajectories = trajectory_params(inputs.params)

    def on(trajectory: str, method: str) -> PredictorResult | None:
        return next(
            (p for p in inputs.predictors if p.trajectory == trajectory and p.method == method),
            None,
        )

    found = []
    for name, traj in trajectories.items():
        if traj.get("kind") != "dswag":
            continue
        baseline = next(
            (
                p
                for p in inputs.predictors
                if p.method == "swag"
                and trajectories.get(p.trajectory, {}).get("start") == name
                and trajectories.get(p.trajectory, {}).get("kind") != "dswag"
            ),
            None,
        )
        roles = DswagRoles(name, on(name, "map"), on(name, "swa"), on(name, "swag"), baseline)
        if any(p is not None for p in roles[1:]):
            found.append(roles)
    found.sort(key=lambda r: (r.dswag is None) + (r.baseline is None))
    return found[0] if found else None


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def _snapshots(point: SweepPoint) -> str:
    return f"{point.snapshots} snapshot" + ("" if point.snapshots == 1 else "s")


def _w(point: SweepPoint) -> str:
    return f"W={point.workers}"


def no_variance(point: SweepPoint) -> bool:
    """Fewer than 2 snapshots: the SWAG diagonal is zero and DSWAG cannot sample."""
    return point.snapshots < 2


def accuracy_interval(ours: float, theirs: float, n: int) -> tuple[float, float]:
    """95% interval of ``ours - theirs`` for two accuracies on the same ``n`` points, unpaired."""
    se = math.sqrt((ours * (1 - ours) + theirs * (1 - theirs)) / n)
    delta = ours - theirs
    return delta - _Z95 * se, delta + _Z95 * se


def _test_size(inputs: ReportInputs, p: PredictorResult | None = None) -> int | None:
    n = p.metric("n") if p is not None else math.nan
    if not math.isfinite(n):
        n = float(inputs.dataset_summary.get("test") or math.nan)
    return int(n) if math.isfinite(n) and n > 0 else None


def _steps(
    points: Sequence[SweepPoint],
    values: Sequence[float],
    rising: bool,
    fmt: Any,
    words: tuple[str, str] = ("higher", "lower"),
) -> tuple[str, str]:
    """Whether ``values`` move with W the claimed way, and the listing of them.

    NaN values are skipped; a tie is not a move; two neighbouring infinities
    (target not reached) are not compared. Returns a verdict ("holds at every
    step", "holds from the smallest to the largest W only: ...", "does not
    hold: ...", or "cannot be checked: ...") and the listing "W=a v, W=b v".
    """
    pairs = [(p, v) for p, v in zip(points, values, strict=True) if not math.isnan(v)]
    listing = ", ".join(f"{_w(p)} {fmt(v)}" for p, v in pairs)
    if len(pairs) < 2:
        return "cannot be checked: fewer than two worker counts have it", listing

    def moves(a: float, b: float) -> bool:
        return b > a if rising else b < a

    word = words[0] if rising else words[1]
    # Two infinite values (neither reached the target) say nothing about the order.
    known = [
        (first, second)
        for first, second in itertools.pairwise(pairs)
        if not (math.isinf(first[1]) and math.isinf(second[1]))
    ]
    if not known:
        return "cannot be checked: no two neighbouring worker counts can be ordered", listing
    against = [
        f"{_w(q)} ({fmt(b)}) is not {word} than {_w(p)} ({fmt(a)})"
        for (p, a), (q, b) in known
        if not moves(a, b)
    ]
    unordered = [
        f"{_w(p)} and {_w(q)} both {fmt(a)}"
        for (p, a), (q, b) in itertools.pairwise(pairs)
        if math.isinf(a) and math.isinf(b)
    ]
    if not against:
        if unordered:
            return f"holds at every step that can be ordered ({'; '.join(unordered)})", listing
        return "holds at every step", listing
    if moves(pairs[0][1], pairs[-1][1]):
        return f"holds from the smallest to the largest W only: {'; '.join(against)}", listing
    return f"does not hold: {'; '.join(against)}", listing


def _rounds_text(value: float) -> str:
    return "not reached" if math.isinf(value) else f"{value:g} rounds"


def _m(value: float | None) -> str:
    return "n/a (no m = 0 row)" if value is None else f"m = {value:g}"


def _rounds_label(point: SweepPoint) -> str:
    if point.rounds_to_target is None:
        return f"not reached in {point.rounds} rounds"
    return str(point.rounds_to_target)


def rounds_table(sweep: list[SweepPoint]) -> Table | None:
    """Rounds to the target per W and where phase 1 ended; None without a sweep."""
    if not sweep:
        return None
    header = [
        "W (clients)",
        "Rounds run",
        "Rounds to target",
        "Train accuracy (%) at the end",
        "Test accuracy (%) at the end",
        "Snapshots",
    ]
    rows = []
    for p in sweep:
        last = p.history[-1] if p.history else {}
        accs = [
            f"{100 * last[k]:.2f}" if isinstance(last.get(k), float) else "n/a"
            for k in ("train_accuracy", "test_accuracy")
        ]
        target = Cell(_rounds_label(p))
        snapshots = f"{p.snapshots}" + (" (no variance)" if no_variance(p) else "")
        rows.append([Cell(str(p.workers)), Cell(str(p.rounds)), target, *map(Cell, accs)])
        rows[-1].append(Cell(snapshots))
    return Table(header, rows)


_SWEEP_COLUMNS = (
    ("accuracy", "Accuracy (%)", True, lambda v: f"{100 * v:.2f}"),
    ("nll", "NLL", False, lambda v: f"{v:.4f}"),
    ("ece", "ECE (20 bins)", False, lambda v: f"{v:.4f}"),
    ("brier", "Brier", False, lambda v: f"{v:.4f}"),
)


def sweep_table(sweep: list[SweepPoint]) -> Table | None:
    """FedAvg, DSWA and DSWAG test metrics per W; bold: the best of the three at that W."""
    if not sweep:
        return None
    header = ["W (clients)", "Predictor", *(label for _, label, _, _ in _SWEEP_COLUMNS)]
    rows = []
    for p in sweep:
        best = {}
        for key, _, higher, _ in _SWEEP_COLUMNS:
            values = [v for k, _ in SWEEP_PREDICTORS if math.isfinite(v := p.metric(k, key))]
            best[key] = (max if higher else min)(values) if values else None
        for key, label in SWEEP_PREDICTORS:
            row = [Cell(str(p.workers)), Cell(label)]
            if p.metrics.get(key) is None:
                why = NO_VARIANCE if key == "dswag" and no_variance(p) else "not evaluated"
                row += [Cell(f"n/a ({why})")] + [Cell("n/a")] * (len(_SWEEP_COLUMNS) - 1)
            else:
                for metric, _, _, fmt in _SWEEP_COLUMNS:
                    v = p.metric(key, metric)
                    row.append(Cell(fmt(v), v == best[metric]) if math.isfinite(v) else Cell("n/a"))
            rows.append(row)
    return Table(header, rows)


class SigmaCurve(NamedTuple):
    """Accuracy at theta_bar + m sigma z over the draws, per multiple m (sorted)."""

    multiples: list[float]
    mean: list[float]
    low: list[float]
    high: list[float]
    sigma_norm: float


def sigma_curve_of(rows: list[dict[str, float]]) -> SigmaCurve | None:
    """Mean and min-max accuracy per multiple m over the draws of sigma-distance rows
    (the sweep's and the landscape stages' share the format); None without rows."""
    by_m: dict[float, list[float]] = {}
    for r in rows:
        by_m.setdefault(float(r["multiple"]), []).append(float(r["accuracy"]))
    if not by_m:
        return None
    ms = sorted(by_m)
    norms = [float(r["sigma_norm"]) for r in rows if "sigma_norm" in r]
    return SigmaCurve(
        ms,
        [sum(by_m[m]) / len(by_m[m]) for m in ms],
        [min(by_m[m]) for m in ms],
        [max(by_m[m]) for m in ms],
        max(norms, default=0.0),
    )


def sigma_curve(point: SweepPoint) -> SigmaCurve | None:
    """The sweep point's curve (``sigma_curve_of`` its rows)."""
    return sigma_curve_of(point.sigma_distance)


def flat_range(curve: SigmaCurve, tolerance: float = FLAT_TOLERANCE) -> float | None:
    """The largest m up to which every mean accuracy stays within ``tolerance`` of m = 0's.

    None when there is no m = 0 row to compare with.
    """
    if not curve.multiples or curve.multiples[0] != 0:
        return None
    reach = 0.0
    for m, acc in zip(curve.multiples, curve.mean, strict=True):
        if acc < curve.mean[0] - tolerance:
            break
        reach = m
    return reach


def has_variance(point: SweepPoint, curve: SigmaCurve) -> bool:
    return not no_variance(point) and curve.sigma_norm > 0


def sigma_table(sweep: list[SweepPoint]) -> Table | None:
    """Fig. 6's numbers per W; None when no point has sigma-distance rows."""
    rows = []
    for p in sweep:
        curve = sigma_curve(p)
        if curve is None:
            continue
        last = curve.multiples[-1]
        if not has_variance(p, curve):
            flat, at_last = f"every m (sigma = 0: {NO_VARIANCE})", "as at theta_bar"
        else:
            reach = flat_range(curve)
            flat = f"{reach:g}" if reach is not None else "n/a (no m = 0)"
            at_last = (
                f"{100 * curve.mean[-1]:.2f} ({100 * curve.low[-1]:.2f} to "
                f"{100 * curve.high[-1]:.2f})"
            )
        rows.append(
            [
                Cell(str(p.workers)),
                Cell(str(p.snapshots)),
                Cell(f"{curve.sigma_norm:.3g}"),
                Cell(f"{100 * curve.mean[0]:.2f}" if curve.multiples[0] == 0 else "n/a"),
                Cell(flat),
                Cell(at_last),
            ]
        )
    if not rows:
        return None
    header = [
        "W (clients)",
        "Snapshots",
        "||sigma||",
        "Accuracy (%) at m = 0",
        f"Within {100 * FLAT_TOLERANCE:g} pp of m = 0 up to m",
        f"Accuracy (%) at m = {last:g}: mean (min to max)",
    ]
    return Table(header, rows)


def _mean_confidence(p: PredictorResult) -> tuple[float, float] | None:
    """Count-weighted mean confidence and accuracy from the reliability bins."""
    n = sum(r.get("count", 0) for r in p.reliability)
    if n <= 0:
        return None
    conf = sum(r.get("count", 0) * r["confidence"] for r in p.reliability) / n
    acc = sum(r.get("count", 0) * r["accuracy"] for r in p.reliability) / n
    return conf, acc


def _confidence_text(p: PredictorResult) -> str:
    found = _mean_confidence(p)
    if found is None:
        return f"{p.name}: no reliability bins"
    conf, acc = found
    gap = acc - conf
    side = "under-confident" if gap > 0 else "over-confident" if gap < 0 else "calibrated"
    return (
        f"{p.name} mean confidence {_pct(conf)}, accuracy - confidence {100 * gap:+.2f} pp "
        f"({side} on average)"
    )


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
    label = _LABELS[metric]
    if not (math.isfinite(ours) and math.isfinite(theirs)):
        return None, f"{label} missing"
    scale, digits, unit = (100.0, 2, " pp") if acc else (1.0, 4, "")

    def signed(v: float) -> str:
        return f"{scale * v:+.{digits}f}"

    values = f"{_pct(ours)} vs {_pct(theirs)}" if acc else f"{ours:.4f} vs {theirs:.4f}"
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


def _accuracy_lower(point: SweepPoint, ours: str, theirs: str, n: int) -> float:
    """Lower end of the 95% interval of the accuracy difference ``ours - theirs`` at a W."""
    return accuracy_interval(point.metric(ours, "accuracy"), point.metric(theirs, "accuracy"), n)[0]


def _claim_b(inputs: ReportInputs, roles: DswagRoles | None, unc: Uncertainty) -> Claim:
    """On the dswag trajectory: holds when NLL is lower and accuracy shown higher, does
    not when neither; paired intervals decide both where there are predictions."""
    statement = "(b) DSWAG improves on its own FedAvg model (NLL, accuracy)"
    if roles is None or roles.dswag is None or roles.fedavg is None:
        why = "Cannot be checked: no DSWAG and FedAvg predictors on a dswag trajectory."
        return Claim(PAPER, statement, None, why)
    d, f = roles.dswag, roles.fedavg
    comp = unc.comparison(f.name, d.name)
    nll, nll_text = _compare(comp, "nll", d, f)
    acc, acc_text = _compare(comp, "accuracy", d, f, _test_size(inputs, d))
    ours, theirs = d.metric("nll"), f.metric("nll")
    if not (math.isfinite(ours) and math.isfinite(theirs)):
        return Claim(PAPER, statement, None, f"{d.name} vs {f.name}: {nll_text}; {acc_text}.")
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
    return Claim(PAPER, statement, holds, evidence)


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
        n = _test_size(inputs)
        nll = [p for p in rows if p.metric("dswag", "nll") < p.metric("fedavg", "nll")]
        acc = [p for p in rows if p.metric("dswag", "accuracy") > p.metric("fedavg", "accuracy")]
        shown = [p for p in rows if n and _accuracy_lower(p, "dswag", "fedavg", n) > 0]
        deltas = ", ".join(
            f"{_w(p)} {p.metric('dswag', 'nll') - p.metric('fedavg', 'nll'):+.4f}" for p in rows
        )
        parts.append(
            f"DSWAG's NLL is lower than FedAvg's at {len(nll)} of {len(rows)} worker counts "
            f"(DSWAG - FedAvg: {deltas}); its accuracy is higher at {len(acc)} of {len(rows)}, "
            f"with the unpaired binomial 95% interval excluding 0 at {len(shown)}"
            + (f" ({', '.join(_w(p) for p in shown)})" if shown else "")
            + " (the sweep keeps no per-point predictions)"
        )
        both = [p for p in nll if p in shown]
        holds = True if len(both) == len(rows) else False if not (nll or shown) else None
    skipped = [p for p in inputs.dswag_sweep if no_variance(p)]
    if skipped:
        listed = ", ".join(f"{_w(p)} ({_snapshots(p)})" for p in skipped)
        parts.append(f"no DSWAG at {listed}: {NO_VARIANCE}")
    if not rows:
        why = "cannot be checked: no worker count has DSWAG's and FedAvg's NLL and accuracy"
        parts.insert(0, why)
    text = "; ".join(parts)
    return Claim(PAPER, statement, holds, _upper(text) + ".")


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
        return [Claim(PAPER, statement, None, why)]
    d, b = roles.dswag, roles.baseline
    keys = ("ece", "nll", "accuracy", "brier")
    if not all(math.isfinite(p.metric(k)) for p in (d, b) for k in ("ece", "nll")):
        found = [Claim(PAPER, statement, None, _claim(d, b, keys) + ".")]
    else:
        comp = unc.comparison(b.name, d.name)
        n = _test_size(inputs, d)
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
        found = [Claim(PAPER, statement, calibrated, evidence)]
    conf = [_mean_confidence(p) for p in (d, b)]
    if conf[0] is not None and conf[1] is not None:
        found.append(
            Claim(
                PAPER,
                "(c') DSWAG gives more confident predictions than SWAG (the paper's conclusion)",
                conf[0][0] > conf[1][0],
                f"{_confidence_text(d)}; {_confidence_text(b)}.",
            )
        )
    return found


def _claim_a(sweep: list[SweepPoint]) -> list[Claim]:
    if not sweep:
        return []
    target = sweep[0].target_accuracy
    values = [math.inf if p.rounds_to_target is None else float(p.rounds_to_target) for p in sweep]
    verdict, _ = _steps(sweep, values, True, _rounds_text, ("more", "fewer"))
    listing = ", ".join(f"{_w(p)} {_rounds_label(p)}" for p in sweep)
    rounds = Claim(
        PAPER,
        "(a) More workers need more phase-1 rounds to reach the target (the paper's Fig. 5 left)",
        _holds([verdict]),
        f"Rounds until the global model's train accuracy >= {_pct(target)}: {listing}; {verdict}.",
    )
    final = [p.metric("fedavg", "accuracy") for p in sweep]
    verdict, listing = _steps(sweep, final, False, _pct)
    ending = Claim(
        PAPER,
        "(a') With more workers phase 1 ends at a lower test accuracy (the paper: 'reaches "
        "suboptimal solutions')",
        _holds([verdict]),
        f"FedAvg model's test accuracy: {listing}; {verdict}.",
    )
    return [rounds, ending]


def _claim_d(sweep: list[SweepPoint]) -> list[Claim]:
    curves = [(p, c) for p in sweep if (c := sigma_curve(p)) is not None]
    if not curves:
        return []
    varied = [(p, c) for p, c in curves if has_variance(p, c)]
    flat_m = [p for p, c in varied if (r := flat_range(c)) is not None and r > 0]
    top = curves[0][1].multiples[-1]
    collapsed = [p for p, c in varied if c.mean[-1] < c.mean[0] - COLLAPSE_DROP]
    per_w = "; ".join(
        f"{_w(p)} within {100 * FLAT_TOLERANCE:g} pp of {_pct(c.mean[0])} up to "
        f"{_m(flat_range(c))}, {_pct(c.mean[-1])} at m = {c.multiples[-1]:g} "
        f"(||sigma|| {c.sigma_norm:.3g})"
        for p, c in varied
    )
    both = [p for p in flat_m if p in collapsed]
    if not varied:
        verdict, holds = "cannot be checked: no worker count has a variance", None
    elif len(both) == len(varied):
        verdict, holds = "holds at every W with a variance", True
    elif both:
        verdict, holds = f"holds at {', '.join(_w(p) for p in both)} only", None
    else:
        verdict, holds = "does not hold at any W", False
    evidence = _upper(verdict) + (f": {per_w}." if per_w else ".")
    flat = [p for p, c in curves if not has_variance(p, c)]
    if flat:
        listed = ", ".join(f"{_w(p)} ({_snapshots(p)})" for p in flat)
        evidence += (
            f" Left out: {listed}: {NO_VARIANCE}; sigma = 0 and theta_bar + m * sigma * z "
            "is theta_bar for every m."
        )
    found = [
        Claim(
            PAPER,
            f"(d) The accuracy of the single network theta_bar + m * sigma * z stays within "
            f"{100 * FLAT_TOLERANCE:g} pp of theta_bar's for small m (m >= 1) and collapses "
            f"(falls more than {100 * COLLAPSE_DROP:g} pp) for large m",
            holds,
            evidence,
        )
    ]
    still_flat = [p for p, c in varied if (r := flat_range(c)) is not None and r >= top]
    if not varied:
        flat_text, holds = "cannot be checked: no worker count has a variance", None
    elif len(still_flat) == len(varied):
        flat_text, holds = "holds at every W with a variance", True
    elif still_flat:
        flat_text, holds = f"holds at {', '.join(_w(p) for p in still_flat)} only", None
    else:
        flat_text, holds = "does not hold at any W", False
    reaches = ", ".join(f"{_w(p)} {_m(flat_range(c))}" for p, c in varied)
    found.append(
        Claim(
            PAPER,
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
    verdict, listing = _steps([p for p, _ in varied], reach, False, _m)
    distance = [r * c.sigma_norm for r, (_, c) in zip(reach, varied, strict=True)]
    far_verdict, far_listing = _steps([p for p, _ in varied], distance, False, lambda v: f"{v:.3g}")
    at_top = [c.mean[-1] for _, c in varied]
    top_verdict, top_listing = _steps([p for p, _ in varied], at_top, False, _pct)
    found.append(
        Claim(
            PAPER,
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
        verdict, listing = _steps(sweep, values, True, lambda v: f"{v:.4f}")
        parts.append(f"{label}: {verdict} ({listing or 'no values'})")
        verdicts.append(verdict)
    missing = [p for p in sweep if p.metrics.get("dswag") is None]
    note = (
        f"; DSWAG has no value at {', '.join(_w(p) for p in missing)} ({NO_VARIANCE})"
        if missing
        else ""
    )
    return [
        Claim(
            PAPER,
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


def overview(inputs: ReportInputs) -> str | None:
    """What was run and how it is compared; None when there is no DSWAG data at all."""
    roles = dswag_roles(inputs)
    if roles is None and not inputs.dswag_sweep:
        return None
    text = "Distributed SWAG (Kiriti, Tsai and Duncan; ALGORITHMS §8). "
    if roles is not None:
        names = {
            "the FedAvg model that phase 1 ends with": roles.fedavg,
            "the SWA mean of the clients' phase-2 snapshots": roles.dswa,
            "the SWAG posterior of those snapshots (DSWAG)": roles.dswag,
        }
        said = [f"{p.name} is {what}" for what, p in names.items() if p is not None]
        text += f"On trajectory {roles.trajectory}: {', '.join(said)}. "
        if roles.baseline is not None:
            text += (
                f"The paper's baseline, SWAG after distributed training, is {roles.baseline.name} "
                f"(trajectory {roles.baseline.trajectory}, one machine, starting from "
                f"{roles.trajectory}'s FedAvg model). "
            )
    if inputs.dswag_sweep:
        sweep = inputs.params.get("evaluate", {}).get("dswag_sweep", {})
        traj = sweep.get("trajectory") if isinstance(sweep, dict) else None
        which = f"trajectory {traj}" if traj else "the dswag trajectory"
        ws = ", ".join(str(p.workers) for p in inputs.dswag_sweep)
        target = _pct(inputs.dswag_sweep[0].target_accuracy)
        cap = max(p.rounds for p in inputs.dswag_sweep)
        cap = sweep.get("rounds", cap) if isinstance(sweep, dict) else cap
        text += (
            f"The worker sweep runs {which} again for W = {ws} clients from the same "
            f"initial network, stopping phase 1 once the global model's train accuracy reaches "
            f"{target} or after {cap} rounds; its FedAvg, DSWA and DSWAG metrics are on the "
            "test split. "
        )
    s = settings(inputs.params)
    text += "Intervals: "
    if roles is not None:
        text += (
            f"the trajectory's predictors are compared by the {100 * s.level:g}% paired "
            f"bootstrap interval over the test points ({s.resamples} resamples, seed {s.seed}) "
            "where both have per-point predictions; where one has none, an accuracy "
            "difference carries an unpaired binomial 95% interval (wider, so conservative) "
            "and NLL, ECE and Brier differences none, and the claim says so. "
        )
    if inputs.dswag_sweep:
        text += (
            "The sweep keeps metrics only: its accuracy differences carry the unpaired "
            "binomial 95% interval, its NLL, ECE and Brier differences none, so a sign is "
            "trusted only when it holds across W."
        )
    return text.rstrip()
