"""The papers' analyses in the report: dataset shift, OOD detection, loss landscape,
sharpness against calibration. Each section: figure(s), a sentence on what it
shows on this run, and the paper claims it checks (``Claim``)."""

from __future__ import annotations

import math
from collections.abc import Callable

from matplotlib.figure import Figure

from . import analyses_figures as fig
from . import analyses_numbers as num
from .claims import Claim
from .distributed import FLAT_TOLERANCE
from .findings import Cell, Table
from .inputs import ReportInputs
from .style import baseline
from .uncertainty import per_inputs

SWA = "SWA (Izmailov et al. 2018)"
BMA = "Bayesian model averaging (SWAG, Maddox et al. 2019)"
FLAT = "Flat-seeking posteriors (Nguyen et al. 2023)"
DSWAG = "DSWAG (Kiriti et al.)"
NO_LANDSCAPE = "no landscape analysis was run"

CAPTIONS = {
    "analysis_shift": "Test metrics on the rotated test subset against the rotation angle (0° is "
    "the clean subset), a row per family with the baseline (dotted grey) in each; F-variants "
    "dashed. Each metric has its own axis.",
    "analysis_shift_gap": "NLL of the baseline minus NLL of each Bayesian predictor per rotation "
    "angle (above 0: the predictor is better), with 95% paired-bootstrap intervals over the "
    "shifted test points where per-point predictions exist.",
    "analysis_ood": "Entropy H[p̄] of the BMA prediction on the test split and on the OOD set "
    "(density, log scale) for the baseline and one predictor per family; the title gives the "
    "AUROC of the entropy score (OOD the positive class).",
    "analysis_line": "Along w(t) = w_a + t (w_b - w_a) (t = 0: a's centre, t = 1: b's; dotted "
    "lines): the train loss's data term, the loss with the weight-decay term (log scales), and "
    "the train and test error. BatchNorm statistics are recomputed at every t.",
    "analysis_rays": "Train loss (log scale) and test error along the same seeded random "
    "directions from each centre: every direction thin, the mean over directions bold. The "
    "legend gives the mean width (distance at which the loss rose by delta).",
    "analysis_swag_directions": "Train loss and test accuracy along each SWAG posterior's top "
    "principal directions, in multiples of the standard deviation sigma along each.",
    "analysis_sigma_distance": "Test accuracy of the single network theta_bar + m sigma z "
    "(mean over the draws z, band: min to max) for each SWAG-kind posterior of the pipeline "
    "(solid/dashed) and, dotted grey, each W of the DSWAG sweep (the same points as the DSWAG "
    "figure). Symmetric log x axis, m = 0 is theta_bar.",
    "analysis_sharpness": "Test NLL (top) and ECE (bottom) against tr(H) (left) and the SAM "
    "sharpness (right), log x axes; one point per predictor, open for flat-seeking variants. "
    "The title gives Spearman's rank correlation over the predictors shown.",
}


@per_inputs
def _shift_gaps(inputs: ReportInputs) -> list[num.ShiftGap]:
    """Paired bootstraps per Bayesian predictor and angle: drawn, claimed and tabled, so
    computed once per inputs."""
    base = baseline(inputs)
    return num.shift_gaps(inputs, base) if base is not None and num.angles(base) else []


def _first_ood_set(inputs: ReportInputs) -> str | None:
    sets = num.ood_sets(inputs)
    return "animal_mnist" if "animal_mnist" in sets else (sets[0] if sets else None)


def build_figures(inputs: ReportInputs) -> dict[str, Figure]:
    """The analyses' figures by name, before encoding; figures without data left out."""
    ood_set = _first_ood_set(inputs)
    builders: dict[str, Callable[[], Figure | None]] = {
        "analysis_shift": lambda: fig.shift_figure(inputs),
        "analysis_shift_gap": lambda: fig.shift_gap_figure(inputs, _shift_gaps(inputs)),
        "analysis_ood": lambda: fig.ood_histogram_figure(inputs, ood_set) if ood_set else None,
        "analysis_line": lambda: fig.line_figure(inputs),
        "analysis_rays": lambda: fig.rays_figure(inputs),
        "analysis_swag_directions": lambda: fig.swag_directions_figure(inputs),
        "analysis_sigma_distance": lambda: fig.sigma_distance_figure(inputs),
        "analysis_sharpness": lambda: fig.sharpness_figure(inputs),
    }
    built = {name: build() for name, build in builders.items()}
    return {name: f for name, f in built.items() if f is not None}


def draw(inputs: ReportInputs) -> dict[str, bytes]:
    """PNG bytes by figure name for every analysis that has data."""
    return {name: fig.png(f) for name, f in build_figures(inputs).items()}


# ---------------------------------------------------------------- claims


def _shift_claim(inputs: ReportInputs, gaps: list[num.ShiftGap]) -> Claim:
    statement = (
        "Bayesian averaging helps most under shift: its NLL gap to the baseline grows with "
        "the rotation"
    )
    if not gaps:
        return Claim(
            BMA, statement, None, "No rotation metrics for the baseline and a Bayesian predictor."
        )
    best = min(gaps, key=lambda g: (-num.large_gap(g), g.predictor))
    zero = best.gap[0] if best.angles[0] == 0 else math.nan
    where = f"{best.predictor} (the largest mean gap at rotations ≥ {num.LARGE_ANGLE:g}°)"
    text = (
        f"For {where}: gap {zero:+.4f} at 0°, {num.large_gap(best):+.4f} averaged over "
        f"≥ {num.LARGE_ANGLE:g}°"
    )
    if best.growth is None:
        return Claim(BMA, statement, None, text + "; no per-point predictions, so no interval.")
    g = best.growth
    verdicts = [num.growth_verdict(x) for x in gaps]
    counts = f"{verdicts.count(True)} of {len(gaps)} Bayesian predictors grow beyond noise"
    text += (
        f"; growth {g.value:+.4f} [95% {g.low:+.4f}, {g.high:+.4f}] (paired bootstrap); {counts}."
    )
    return Claim(BMA, statement, num.growth_verdict(best), text)


def _ood_claim(inputs: ReportInputs) -> Claim:
    statement = "Bayesian predictors detect OOD inputs better than the baseline (AUROC of H[p̄])"
    ood_set, base = _first_ood_set(inputs), baseline(inputs)
    if (
        ood_set is None
        or base is None
        or math.isnan(num.ood_value(base, ood_set, "entropy", "auroc"))
    ):
        return Claim(BMA, statement, None, "No OOD metrics for the baseline.")
    ref = num.ood_value(base, ood_set, "entropy", "auroc")
    higher, lower, n = [], [], 0
    for p in inputs.predictors:
        value = num.ood_value(p, ood_set, "entropy", "auroc")
        if p.name == base.name or not num.is_bayesian(p) or math.isnan(value):
            continue
        n += 1
        margin = num.auroc_margin(base, p, ood_set) or 0.0
        if value > ref + margin:
            higher.append(p.name)
        elif value < ref - margin:
            lower.append(p.name)
    if n == 0:
        return Claim(BMA, statement, None, "No Bayesian predictor has OOD metrics.")
    holds = True if len(higher) > n / 2 else (False if len(higher) <= len(lower) else None)
    text = (
        f"On {ood_set}, {base.name}'s AUROC is {ref:.4f}; of {n} Bayesian predictors, "
        f"{len(higher)} are higher beyond two standard errors (Hanley-McNeil, unpaired) "
        f"and {len(lower)} lower" + (f" (lower: {', '.join(lower)})" if lower else "") + "."
    )
    return Claim(BMA, statement, holds, text)


def _line_claims(inputs: ReportInputs) -> list[Claim]:
    statement = "SGD ends at the edge of the basin on the line SGD → SWA, SWA near its centre"
    lines = inputs.landscape.lines if inputs.landscape is not None else {}
    if not lines:
        return [Claim(SWA, statement, None, f"No line was computed: {NO_LANDSCAPE}.")]
    out = []
    for name, line in sorted(lines.items()):
        m = num.line_minimum(line)
        label = f"{statement} ({name}: {line.a} → {line.b})"
        if m is None:
            out.append(
                Claim(SWA, label, None, f"The line {name} has no t = 0 with a point after it.")
            )
            continue
        slope = "falls" if m.on_slope else "does not fall"
        text = (
            f"Train loss is lowest at t = {m.t_min:g} ({m.loss_min:.4g}; t = 0 is {line.a}, t = 1 "
            f"{line.b}); from t = 0 ({m.loss_at_0:.4g}) it {slope} to {m.loss_next:.4g} at "
            f"t = {m.t_next:g}. Rule: holds if the minimum lies at t > 0.5 and t = 0 is on a "
            "slope; undecided if the minimum is the grid's last t (the loss still falls beyond b)."
        )
        out.append(Claim(SWA, label, num.edge_verdict(m), text))
    return out


WIDTH_PAIRS = ((SWA, "sgd", "swag"), (FLAT, "swag", "fswag"), (FLAT, "hwa", "fhwa"))


def _width_claims(inputs: ReportInputs) -> list[Claim]:
    rays = inputs.landscape.rays if inputs.landscape is not None else {}
    out = []
    for paper, narrow, wide in WIDTH_PAIRS:
        statement = f"The {wide} centre lies in a wider region of low train loss than {narrow}'s"
        if narrow not in rays or wide not in rays:
            if paper == SWA:
                reason = NO_LANDSCAPE if not rays else f"rays from {narrow} and {wide} missing"
                out.append(Claim(paper, statement, None, f"No widths: {reason}."))
            continue
        c = num.compare_widths(rays[narrow], rays[wide])
        if c is None:
            out.append(Claim(paper, statement, None, "No ray widths were recorded."))
            continue
        censored = f"; {c.censored} width(s) beyond the grid count as its end" if c.censored else ""
        text = (
            f"Mean width {c.mean_wide:.3g} ({wide}) vs {c.mean_narrow:.3g} ({narrow}) at delta "
            f"{rays[wide].delta:g}; {wide} is wider in {c.wider} and narrower in {c.narrower} of "
            f"{c.directions} shared directions{censored}. Rule: holds if wider on average and in "
            "most directions."
        )
        out.append(Claim(paper, statement, c.verdict, text))
    return out


def _sigma_claims(inputs: ReportInputs) -> list[Claim]:
    statement = f"SWAG accuracy stays flat out to {num.PAPER_FLAT_MULTIPLE:g} sigma from theta_bar"
    swag = inputs.landscape.swag if inputs.landscape is not None else {}
    out = []
    for traj, s in sorted(swag.items()):
        c = num.sigma_curve(s.sigma_distance)
        reach = num.flat_up_to(c) if c is not None else None
        if c is None or reach is None:
            out.append(Claim(DSWAG, f"{statement} ({traj})", None, "No m = 0 row to compare with."))
            continue
        text = (
            f"{traj}: mean accuracy {100 * c.mean[0]:.2f}% at m = 0 stays within "
            f"{100 * FLAT_TOLERANCE:g} pp up to m = {reach:g}; {100 * c.mean[-1]:.2f}% at "
            f"m = {c.multiples[-1]:g} (||sigma|| {c.sigma_norm:.3g})."
        )
        out.append(Claim(DSWAG, f"{statement} ({traj})", num.flat_verdict(c, reach), text))
    if not out:
        out.append(Claim(DSWAG, statement, None, f"No SWAG sigma-distance rows: {NO_LANDSCAPE}."))
    return out


def sharpness_correlations(inputs: ReportInputs, x: str) -> list[num.Correlation]:
    found = [num.correlation(inputs.predictors, x, y) for y in ("ece", "nll")]
    return [c for c in found if c is not None]


def _sharpness_claims(inputs: ReportInputs) -> list[Claim]:
    out = []
    for x, label in (("sharpness", "SAM sharpness"), ("hessian_trace", "tr(H)")):
        statement = f"Flatter is better calibrated: lower {label} goes with lower ECE and NLL"
        found = sharpness_correlations(inputs, x)
        if not found:
            out.append(Claim(FLAT, statement, None, f"Fewer than 3 predictors have {label}."))
            continue
        parts = "; ".join(
            f"rho({label}, {c.y.upper()}) = {c.rho:+.2f} (one-sided permutation p = {c.p:.3f})"
            for c in found
        )
        text = (
            f"Spearman over n = {found[0].n} predictors (small: ranks move with one "
            f"predictor): {parts}. "
            f"Rule: holds if every rho ≥ {num.MIN_RHO:g} with p < 0.05, fails if none is positive."
        )
        out.append(Claim(FLAT, statement, num.flat_calibrated_verdict(found), text))
    return out


def claims(inputs: ReportInputs) -> list[Claim]:
    """The analyses' paper claims, each checked on this run."""
    return [
        _shift_claim(inputs, _shift_gaps(inputs)),
        _ood_claim(inputs),
        *_line_claims(inputs),
        *_width_claims(inputs),
        *_sigma_claims(inputs),
        *_sharpness_claims(inputs),
    ]


# ---------------------------------------------------------------- sections


def _fmt(v: float, spec: str = ".4f") -> str:
    return format(v, spec) if math.isfinite(v) else "-"


def _shift_table(inputs: ReportInputs) -> Table | None:
    rows = []
    for p in inputs.predictors:
        s = num.corruption_summary(p)
        if s is None:
            continue
        m = s["means"]
        rows.append(
            [Cell(p.name), Cell(_fmt(100 * m["accuracy"], ".2f"))]
            + [Cell(_fmt(m[k])) for k in ("nll", "ece", "brier", "entropy")]
            + [Cell(f"{s['worst']} ({_fmt(s['worst_nll'])})")]
        )
    if not rows:
        return None
    header = ["Predictor", "Accuracy (%)", "NLL", "ECE", "Brier", "Entropy", "Worst (NLL)"]
    return Table(header, rows)


def _gap_table(gaps: list[num.ShiftGap]) -> Table:
    def interval(iv: num.Range | None) -> str:
        return f"{iv.value:+.4f} [{iv.low:+.4f}, {iv.high:+.4f}]" if iv else "-"

    verdict = {True: "grows", False: "shrinks", None: "within noise / no interval"}
    rows = [
        [
            Cell(g.predictor),
            Cell(_fmt(g.gap[0], "+.4f") if g.angles[0] == 0 else "-"),
            Cell(_fmt(num.large_gap(g), "+.4f")),
            Cell(interval(g.growth)),
            Cell(verdict[num.growth_verdict(g)], bold=num.growth_verdict(g) is True),
        ]
        for g in gaps
    ]
    header = [
        "Predictor",
        "Gap at 0°",
        f"Mean gap ≥ {num.LARGE_ANGLE:g}°",
        "Growth [95%]",
        "Verdict",
    ]
    return Table(header, rows)


def _shift_sentence(inputs: ReportInputs, gaps: list[num.ShiftGap]) -> str:
    base = baseline(inputs)
    angles = num.angles(base) if base is not None else []
    if not angles:
        return "The baseline has no rotation metrics."
    first, last = angles[0][1], angles[-1][1]
    acc = [num.shift_value(base, n, "accuracy") for n in (first, last)]
    text = (
        f"The baseline's accuracy falls from {100 * acc[0]:.1f}% at {angles[0][0]:g}° to "
        f"{100 * acc[1]:.1f}% at {angles[-1][0]:g}°"
    )
    if gaps:
        best = max(gaps, key=lambda g: (num.large_gap(g), g.predictor))
        gap = num.large_gap(best)
        text += f"; the largest NLL gap at large rotations is {best.predictor}'s ({gap:+.4f})"
    return text + "."


def _claim_bullets(found: list[Claim]) -> object:
    from .document import Bullets

    return Bullets([f"{c.statement} ({c.paper}): {c.verdict}. {c.evidence}" for c in found])


def _figure(name: str, pngs: dict[str, bytes]) -> list[object]:
    from .document import FigureBlock

    return [FigureBlock(name, pngs[name], CAPTIONS[name])] if name in pngs else []


def _shift_section(inputs: ReportInputs, pngs: dict[str, bytes]) -> list[object]:
    from .document import Heading, Paragraph, TableBlock

    gaps = _shift_gaps(inputs)
    blocks: list[object] = [Heading(2, "Dataset shift")]
    if "analysis_shift" not in pngs:
        return [*blocks, Paragraph("No predictor has shift metrics; nothing to show.")]
    blocks += [Paragraph(_shift_sentence(inputs, gaps)), *_figure("analysis_shift", pngs)]
    table = _shift_table(inputs)
    if table is not None:
        note = (
            "Mean over the corruptions (one fixed severity each) per predictor; the worst "
            "corruption by NLL in the last column."
        )
        blocks += [Paragraph(note), TableBlock(table)]
    blocks += _figure("analysis_shift_gap", pngs)
    if gaps:
        blocks.append(TableBlock(_gap_table(gaps)))
    return [*blocks, _claim_bullets([_shift_claim(inputs, gaps)])]


def _ood_table(inputs: ReportInputs, ood_set: str, score: str) -> Table | None:
    rows = []
    for p in inputs.predictors:
        values = [num.ood_value(p, ood_set, score, k) for k, _ in num.OOD_KEYS]
        if all(math.isnan(v) for v in values):
            continue
        if score == "mutual_info" and not num.is_bayesian(p):
            rows.append([Cell(p.name)] + [Cell("- (single network: MI = 0)")] + [Cell("-")] * 3)
            continue
        rows.append([Cell(p.name)] + [Cell(_fmt(v)) for v in values])
    return Table(["Predictor", *(label for _, label in num.OOD_KEYS)], rows) if rows else None


def _ood_section(inputs: ReportInputs, pngs: dict[str, bytes]) -> list[object]:
    from .document import Heading, Paragraph, TableBlock

    blocks: list[object] = [Heading(2, "Out-of-distribution detection")]
    sets = num.ood_sets(inputs)
    if not sets:
        return [*blocks, Paragraph("No predictor has OOD metrics; nothing to show.")]
    blocks.append(
        Paragraph(
            "OOD is the positive class. Scores: 1 - max p̄ (max softmax probability), H[p̄] (entropy "
            "of the BMA prediction) and the mutual information H[p̄] - mean H[p_s] (0 for a single "
            "network, whose AUROC by MI is 0.5 by construction). FPR95: the share of test images "
            "flagged when 95% of the OOD images are."
        )
    )
    for ood_set in sets:
        for score, label in num.OOD_SCORES:
            table = _ood_table(inputs, ood_set, score)
            if table is not None:
                blocks += [Heading(3, f"{ood_set}, score {label}"), TableBlock(table)]
    blocks += _figure("analysis_ood", pngs)
    return [*blocks, _claim_bullets([_ood_claim(inputs)])]


def _widths_table(inputs: ReportInputs) -> Table | None:
    rays = inputs.landscape.rays if inputs.landscape is not None else {}
    if not rays:
        return None
    n = max(len(r.widths) for r in rays.values())
    rows = []
    for traj, r in rays.items():
        widths = [
            _fmt(w, ".3g") if w is not None else f"> {num.ray_grid_end(r):g}" for w in r.widths
        ]
        mean = sum(num.ray_widths(r)) / len(r.widths) if r.widths else math.nan
        rows.append(
            [Cell(f"{traj} ({r.centre})"), Cell(_fmt(mean, ".3g"))] + [Cell(w) for w in widths]
        )
    return Table(["Centre", "Mean width", *(f"d{i + 1}" for i in range(n))], rows)


def _sigma_table(inputs: ReportInputs) -> Table | None:
    swag = inputs.landscape.swag if inputs.landscape is not None else {}
    rows = []
    for traj, s in sorted(swag.items()):
        c = num.sigma_curve(s.sigma_distance)
        if c is None:
            continue
        reach = num.flat_up_to(c)
        rows.append(
            [
                Cell(traj),
                Cell(f"{c.sigma_norm:.3g}"),
                Cell(f"{100 * c.mean[0]:.2f}"),
                Cell("-" if reach is None else f"{reach:g}"),
                Cell(f"{100 * c.mean[-1]:.2f} ({100 * c.low[-1]:.2f} to {100 * c.high[-1]:.2f})"),
            ]
        )
    if not rows:
        return None
    header = [
        "Posterior",
        "||sigma||",
        "Accuracy (%) at m = 0",
        f"Within {100 * FLAT_TOLERANCE:g} pp up to m",
        "Accuracy (%) at the largest m: mean (min to max)",
    ]
    return Table(header, rows)


def _landscape_sentence(inputs: ReportInputs) -> str:
    parts = []
    for name, line in sorted(inputs.landscape.lines.items()) if inputs.landscape else []:
        m = num.line_minimum(line)
        if m is not None:
            parts.append(f"on {name} the train loss is lowest at t = {m.t_min:g}")
    rays = inputs.landscape.rays if inputs.landscape else {}
    if rays:
        widest = max(rays, key=lambda k: (sum(num.ray_widths(rays[k])), k))
        parts.append(f"{widest} has the widest mean ray width")
    return ("On this run " + "; ".join(parts) + ".") if parts else "No line or ray was computed."


def _landscape_section(inputs: ReportInputs, pngs: dict[str, bytes]) -> list[object]:
    from .document import Heading, Paragraph, TableBlock

    blocks: list[object] = [Heading(2, "Loss landscape")]
    if inputs.landscape is None:
        return [*blocks, Paragraph(f"No landscape figures: {NO_LANDSCAPE}.")]
    blocks += [Paragraph(_landscape_sentence(inputs)), *_figure("analysis_line", pngs)]
    blocks.append(_claim_bullets(_line_claims(inputs)))
    blocks += _figure("analysis_rays", pngs)
    widths = _widths_table(inputs)
    if widths is not None:
        blocks.append(TableBlock(widths))
    blocks += [_claim_bullets(_width_claims(inputs)), *_figure("analysis_swag_directions", pngs)]
    blocks += _figure("analysis_sigma_distance", pngs)
    sigma = _sigma_table(inputs)
    if sigma is not None:
        blocks.append(TableBlock(sigma))
    return [*blocks, _claim_bullets(_sigma_claims(inputs))]


def _sharpness_section(inputs: ReportInputs, pngs: dict[str, bytes]) -> list[object]:
    from .document import Heading, Paragraph, TableBlock

    blocks: list[object] = [Heading(2, "Sharpness and calibration")]
    found = [c for x in ("sharpness", "hessian_trace") for c in sharpness_correlations(inputs, x)]
    if not found:
        return [
            *blocks,
            Paragraph("Fewer than 3 predictors have sharpness and tr(H); nothing to show."),
        ]
    strongest = max(found, key=lambda c: (abs(c.rho), c.x, c.y))
    blocks += [
        Paragraph(
            f"The strongest rank correlation is between {strongest.x} and {strongest.y.upper()} "
            f"(rho = {strongest.rho:+.2f} over {strongest.n} predictors)."
        ),
        *_figure("analysis_sharpness", pngs),
        TableBlock(
            Table(
                ["Sharpness", "Metric", "Spearman rho", "Permutation p (rho ≥ observed)", "n"],
                [
                    [
                        Cell(c.x),
                        Cell(c.y),
                        Cell(f"{c.rho:+.3f}"),
                        Cell(f"{c.p:.3f}"),
                        Cell(str(c.n)),
                    ]
                    for c in found
                ],
            )
        ),
    ]
    return [*blocks, _claim_bullets(_sharpness_claims(inputs))]


def sections(inputs: ReportInputs, pngs: dict[str, bytes]) -> list[object]:
    """The analyses' report blocks (``document`` block types), in report order."""
    return [
        *_shift_section(inputs, pngs),
        *_ood_section(inputs, pngs),
        *_landscape_section(inputs, pngs),
        *_sharpness_section(inputs, pngs),
    ]
