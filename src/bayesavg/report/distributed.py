"""The DSWAG paper's claims (Kiriti, Tsai, Duncan; ALGORITHMS §8) as found on this run.

Pure over the input dataclasses, like ``findings``: which predictors play
DSWAG's roles, the worker sweep's tables, and one statement per claim that
says whether it holds here, with the numbers. As in ``findings``, a claim
must be earned: ties and missing values never count for it.

Intervals: the paired bootstrap of ALGORITHMS §10 needs per-point
predictions, which the metrics files do not keep. An accuracy difference
gets an unpaired binomial 95% interval instead; it is wider than the paired
one whenever the two predictors err on the same points (as related networks
do), so "excludes 0" stays a safe statement. NLL, ECE and Brier have no
per-point spread here: their differences are given without an interval, and
the sweep shows whether a sign holds across W.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from .findings import Cell, Table, _claim
from .inputs import PredictorResult, ReportInputs, SweepPoint, trajectory_params

# Fig. 6: accuracy within this much of theta_bar's "stays high"; this much lower "collapses".
FLAT_TOLERANCE = 0.01
COLLAPSE_DROP = 0.10
_Z95 = 1.959963984540054
# The sweep's predictors in the metrics JSON, with their labels.
SWEEP_PREDICTORS = (("fedavg", "FedAvg"), ("dswa", "DSWA"), ("dswag", "DSWAG"))
_NLL_ACC = ("nll", "accuracy")
NO_VARIANCE = "fewer than 2 snapshots, so no variance"
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


def _accuracy_verdict(ours: float, theirs: float, n: int | None) -> tuple[bool, str]:
    """Whether ``ours`` is shown to be more accurate, and the sentence that says so."""
    delta = ours - theirs
    text = f"accuracy {_pct(ours)} vs {_pct(theirs)} ({100 * delta:+.2f} pp"
    if not n:
        return False, text + ", no interval: test size unknown)"
    lo, hi = accuracy_interval(ours, theirs, n)
    text += f", 95% interval {100 * lo:+.2f} to {100 * hi:+.2f} pp"
    if lo > 0:
        return True, text + ": higher)"
    if hi < 0:
        return False, text + ": lower)"
    return False, text + ": includes 0, not shown to differ)"


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


def sigma_curve(point: SweepPoint) -> SigmaCurve | None:
    """The mean and min-max accuracy per multiple; None without rows."""
    by_m: dict[float, list[float]] = {}
    for r in point.sigma_distance:
        by_m.setdefault(float(r["multiple"]), []).append(float(r["accuracy"]))
    if not by_m:
        return None
    ms = sorted(by_m)
    norms = [float(r["sigma_norm"]) for r in point.sigma_distance if "sigma_norm" in r]
    return SigmaCurve(
        ms,
        [sum(by_m[m]) / len(by_m[m]) for m in ms],
        [min(by_m[m]) for m in ms],
        [max(by_m[m]) for m in ms],
        max(norms, default=0.0),
    )


def flat_range(curve: SigmaCurve) -> float | None:
    """The largest m up to which every mean accuracy stays within FLAT_TOLERANCE of m=0's.

    None when there is no m=0 row to compare with.
    """
    if not curve.multiples or curve.multiples[0] != 0:
        return None
    reach = 0.0
    for m, acc in zip(curve.multiples, curve.mean, strict=True):
        if acc < curve.mean[0] - FLAT_TOLERANCE:
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


def _accuracy_lower(point: SweepPoint, ours: str, theirs: str, n: int) -> float:
    """Lower end of the 95% interval of the accuracy difference ``ours - theirs`` at a W."""
    return accuracy_interval(point.metric(ours, "accuracy"), point.metric(theirs, "accuracy"), n)[0]


def _claim_b(inputs: ReportInputs, roles: DswagRoles | None) -> str:
    text = "(b) DSWAG improves on its own FedAvg model (NLL, accuracy): "
    parts = []
    if roles is not None and roles.dswag is not None and roles.fedavg is not None:
        d, f = roles.dswag, roles.fedavg
        ours, theirs = d.metric("nll"), f.metric("nll")
        shown, acc_text = _accuracy_verdict(
            d.metric("accuracy"), f.metric("accuracy"), _test_size(inputs, d)
        )
        if math.isfinite(ours) and math.isfinite(theirs):
            nll_better = ours < theirs
            nll_text = f"NLL {ours:.4f} vs {theirs:.4f} ({ours - theirs:+.4f}, no interval)"
            verdict = (
                "holds"
                if nll_better and shown
                else "holds for NLL only"
                if nll_better
                else "holds for accuracy only"
                if shown
                else "does not hold"
            )
            parts.append(
                f"{verdict} on trajectory {roles.trajectory} ({d.name} vs {f.name}): "
                f"{nll_text}; {acc_text}"
            )
        else:
            parts.append(f"{d.name} vs {f.name}: NLL missing; {acc_text}")
    sweep = [
        p
        for p in inputs.dswag_sweep
        if all(math.isfinite(p.metric(k, m)) for k in ("dswag", "fedavg") for m in _NLL_ACC)
    ]
    if sweep:
        n = _test_size(inputs)
        nll = [p for p in sweep if p.metric("dswag", "nll") < p.metric("fedavg", "nll")]
        acc = [p for p in sweep if p.metric("dswag", "accuracy") > p.metric("fedavg", "accuracy")]
        shown = [p for p in sweep if n and _accuracy_lower(p, "dswag", "fedavg", n) > 0]
        deltas = ", ".join(
            f"{_w(p)} {p.metric('dswag', 'nll') - p.metric('fedavg', 'nll'):+.4f}" for p in sweep
        )
        parts.append(
            f"in the sweep DSWAG's NLL is lower than FedAvg's at {len(nll)} of {len(sweep)} "
            f"worker counts (DSWAG - FedAvg: {deltas}); its accuracy is higher at {len(acc)} of "
            f"{len(sweep)}, with the 95% interval excluding 0 at {len(shown)}"
            + (f" ({', '.join(_w(p) for p in shown)})" if shown else "")
        )
    skipped = [p for p in inputs.dswag_sweep if no_variance(p)]
    if skipped:
        listed = ", ".join(f"{_w(p)} ({_snapshots(p)})" for p in skipped)
        parts.append(f"no DSWAG at {listed}: {NO_VARIANCE}")
    if not parts:
        return text + "cannot be checked: no DSWAG and FedAvg predictors on a dswag trajectory"
    return text + "; ".join(parts)


def _claim_c(inputs: ReportInputs, roles: DswagRoles | None) -> str:
    text = (
        "(c) DSWAG is comparable to SWAG after distributed training, and better calibrated "
        "(the paper's Fig. 5 right and conclusion): "
    )
    if roles is None or roles.dswag is None or roles.baseline is None:
        return text + (
            "cannot be checked: needs a swag predictor on the dswag trajectory and one on a "
            "trajectory that starts from it"
        )
    d, b = roles.dswag, roles.baseline
    ece_d, ece_b = d.metric("ece"), b.metric("ece")
    nll_d, nll_b = d.metric("nll"), b.metric("nll")
    if not all(math.isfinite(v) for v in (ece_d, ece_b, nll_d, nll_b)):
        return text + _claim(d, b, ("accuracy", "nll", "ece", "brier"))
    calibrated = "holds" if ece_d < ece_b else "does not hold"
    nll = "lower" if nll_d < nll_b else "not lower"
    _, acc_text = _accuracy_verdict(
        d.metric("accuracy"), b.metric("accuracy"), _test_size(inputs, d)
    )
    conf = [_mean_confidence(p) for p in (d, b)]
    confident = ""
    if conf[0] is not None and conf[1] is not None:
        more = "holds" if conf[0][0] > conf[1][0] else "does not hold"
        confident = (
            f". The paper's 'DSWAG gives more confident predictions than SWAG' {more}: "
            f"{_confidence_text(d)}; {_confidence_text(b)}"
        )
    return (
        f"{text}better calibration {calibrated} ({d.name} ECE {ece_d:.4f} vs {b.name} "
        f"{ece_b:.4f}, {ece_d - ece_b:+.4f}); NLL {nll} ({nll_d:.4f} vs {nll_b:.4f}, "
        f"{nll_d - nll_b:+.4f}); {acc_text}. All four metrics: "
        f"{_claim(d, b, ('accuracy', 'nll', 'ece', 'brier'))}{confident}"
    )


def _claim_a(sweep: list[SweepPoint]) -> list[str]:
    if not sweep:
        return []
    target = sweep[0].target_accuracy
    values = [math.inf if p.rounds_to_target is None else float(p.rounds_to_target) for p in sweep]
    verdict, _ = _steps(sweep, values, True, _rounds_text, ("more", "fewer"))
    listing = ", ".join(f"{_w(p)} {_rounds_label(p)}" for p in sweep)
    rounds = (
        f"(a) More workers need more phase-1 rounds to reach the target (the global model's "
        f"train accuracy >= {_pct(target)}; the paper's Fig. 5 left): {verdict}. Rounds to "
        f"target: {listing}."
    )
    final = [p.metric("fedavg", "accuracy") for p in sweep]
    verdict, listing = _steps(sweep, final, False, _pct)
    ending = (
        "(a') With more workers phase 1 ends at a lower test accuracy (the paper: 'reaches "
        f"suboptimal solutions'): {verdict}. FedAvg model's test accuracy: {listing}."
    )
    return [rounds, ending]


def _claim_d(sweep: list[SweepPoint]) -> list[str]:
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
        verdict = "cannot be checked: no worker count has a variance"
    elif len(both) == len(varied):
        verdict = "holds at every W with a variance"
    elif both:
        verdict = f"holds at {', '.join(_w(p) for p in both)} only"
    else:
        verdict = "does not hold at any W"
    lines = [
        f"(d) The accuracy of the single network theta_bar + m * sigma * z stays within "
        f"{100 * FLAT_TOLERANCE:g} pp of theta_bar's for small m (m >= 1) and collapses (falls "
        f"more than {100 * COLLAPSE_DROP:g} pp) for large m: {verdict}. {per_w}."
    ]
    still_flat = [p for p, c in varied if (r := flat_range(c)) is not None and r >= top]
    flat_text = (
        f"holds at {', '.join(_w(p) for p in still_flat)}"
        if still_flat
        else "does not hold at any W"
    )
    lines.append(
        f"(d') The paper's Fig. 6: accuracy stays almost flat up to m = 100 (here up to "
        f"m = {top:g}): {flat_text}."
    )
    reach = [float(r) if (r := flat_range(c)) is not None else math.nan for _, c in varied]
    verdict, listing = _steps([p for p, _ in varied], reach, False, _m)
    distance = [r * c.sigma_norm for r, (_, c) in zip(reach, varied, strict=True)]
    far_verdict, far_listing = _steps([p for p, _ in varied], distance, False, lambda v: f"{v:.3g}")
    at_top = [c.mean[-1] for _, c in varied]
    top_verdict, top_listing = _steps([p for p, _ in varied], at_top, False, _pct)
    lines.append(
        "(d'') More workers, less robust to the perturbation (the paper: 'as we increase the "
        f"number of workers, the performance drops'). By the multiple m up to which the accuracy "
        f"stays within {100 * FLAT_TOLERANCE:g} pp: {verdict} ({listing}). By that range as a "
        f"distance m ||sigma|| from theta_bar (sigma differs by W, so the same m is a different "
        f"distance): {far_verdict} ({far_listing}). By the accuracy at m = {top:g}: "
        f"{top_verdict} ({top_listing})."
    )
    flat = [p for p, c in curves if not has_variance(p, c)]
    if flat:
        listed = ", ".join(f"{_w(p)} ({_snapshots(p)})" for p in flat)
        lines.append(
            f"Left out of (d): {listed}: {NO_VARIANCE}; sigma = 0 and theta_bar + m * sigma * z "
            "is theta_bar for every m."
        )
    return lines


def _claim_e(sweep: list[SweepPoint]) -> list[str]:
    if not sweep:
        return []
    parts = []
    for key, label in reversed(SWEEP_PREDICTORS):
        values = [p.metric(key, "nll") for p in sweep]
        verdict, listing = _steps(sweep, values, True, lambda v: f"{v:.4f}")
        parts.append(f"{label}: {verdict} ({listing or 'no values'})")
    missing = [p for p in sweep if p.metrics.get("dswag") is None]
    note = (
        f"; DSWAG has no value at {', '.join(_w(p) for p in missing)} ({NO_VARIANCE})"
        if missing
        else ""
    )
    return [
        "(e) The test NLL increases with the number of workers (the paper's Fig. 7, MNIST): "
        + "; ".join(parts)
        + note
        + "."
    ]


def claims(inputs: ReportInputs) -> list[str]:
    """One statement per claim of the paper, in the order (a) to (e); empty without data."""
    roles = dswag_roles(inputs)
    lines = _claim_a(inputs.dswag_sweep)
    if roles is not None or inputs.dswag_sweep:
        lines.append(_claim_b(inputs, roles))
    if roles is not None:
        lines.append(_claim_c(inputs, roles))
    return lines + _claim_d(inputs.dswag_sweep) + _claim_e(inputs.dswag_sweep)


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
    return text + (
        "Intervals: accuracy differences carry an unpaired binomial 95% interval (conservative; "
        "the paired bootstrap needs per-point predictions, which are not kept); NLL, ECE and "
        "Brier differences have none, so a sign is trusted only when it holds across W."
    )
