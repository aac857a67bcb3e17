"""Loss landscape: the line SGD -> SWA, rays from each centre, SWAG's principal directions
and its sigma-distance curve, with the SWA and DSWAG papers' claims about them."""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from ... import style
from ...blocks import (
    Block,
    Cell,
    Heading,
    Paragraph,
    Section,
    Table,
    TableBlock,
    claim_bullets,
    figure,
)
from ...claims import DSWAG_PAPER, FLAT_PAPER, SWA_PAPER, Claim
from ...formats import fmt_or_dash
from ...inputs import LineData, ReportInputs
from ...sigma_curves import FLAT_TOLERANCE, flat_range, sigma_curve_of
from ...uncertainty import Uncertainty
from . import figures
from .measures import (
    ASYMMETRY,
    NOISE_SE,
    PAPER_FLAT_MULTIPLE,
    SIGN_TEST_P,
    LineAsymmetry,
    SharpnessCheck,
    WidthComparison,
    centre_sharpness,
    compare_widths,
    disagreeing,
    edge_verdict,
    flat_verdict,
    line_asymmetry,
    line_minimum,
    line_value,
    ray_grid_end,
    ray_widths,
    sharpness_checks,
)

DSWAG = DSWAG_PAPER


NO_LANDSCAPE = "no landscape analysis was run"
# Ray widths to two decimals: the claims count each direction wider or narrower, and
# two widths that three digits show alike (21.9, 21.9) would read as a tie.
WIDTH = ".2f"


def _ratio_text(a: LineAsymmetry) -> str:
    if math.isnan(a.ratio):
        return "it does not rise on the far side"
    if math.isinf(a.ratio):
        return "it rises on the far side only"
    return f"ratio {a.ratio:.3g}"


def _line_claim(name: str, line: LineData, statement: str) -> Claim:
    """The SWA paper's picture along one line: steep beyond a, gentle towards b, and a
    better test metric at b."""
    label = f"{statement} ({name}: {line.a} → {line.b})"
    a = line_asymmetry(line)
    if a is None:
        why = f"The line {name} has no t = 0 and t = 1 or no t on both sides of t = 0."
        return Claim(SWA_PAPER, label, None, why, "n/a (no symmetric t)")
    m = line_minimum(line)
    where = f" (train loss lowest at t = {m.t_min:g})" if m is not None else ""
    e0, e1 = line_value(line, "test_error", 0.0), line_value(line, "test_error", 1.0)
    error = f" (test error {e0:.4g} → {e1:.4g})" if e0 is not None and e1 is not None else ""
    metric = "test NLL" if a.test_key == "test_nll" else a.test_key
    t = a.t_far
    text = (
        f"From t = 0 ({line.a}) the train loss rises by {a.rise_away[-1]:.4g} at t = {-t:g} "
        f"(away from {line.b}) and by {a.rise_towards[-1]:.4g} at t = {t:g} (towards it): "
        f"{_ratio_text(a)}; steeper away at {a.steeper_away} of {len(a.ts)} symmetric |t|"
        f"{where}. {metric} {a.test_at_0:.4g} at t = 0 → {a.test_at_1:.4g} at t = 1{error}. "
        f"Rule: holds if the rise at the farthest symmetric |t| away from {line.b} is at least "
        f"{ASYMMETRY:g} times the rise towards it (and larger at most symmetric |t|) and the "
        f"{metric} is lower at t = 1; a train-loss minimum at t = 0 is what the paper reports "
        "(SGD has the better train loss), not a counterexample."
    )
    number = (
        f"rise {a.rise_away[-1]:.3g} at t = {-t:g} vs {a.rise_towards[-1]:.3g} at t = {t:g}; "
        f"{metric} {a.test_at_0:.3g} → {a.test_at_1:.3g}"
    )
    return Claim(SWA_PAPER, label, edge_verdict(a), text, number)


def _line_claims(inputs: ReportInputs) -> list[Claim]:
    statement = (
        "SGD ends at the edge of the basin on the line SGD → SWA: the train loss rises "
        "steeply beyond SGD and gently towards SWA, whose test metric is better"
    )
    lines = inputs.landscape.lines if inputs.landscape is not None else {}
    if not lines:
        why = f"No line was computed: {NO_LANDSCAPE}."
        return [Claim(SWA_PAPER, statement, None, why, "n/a (no landscape)")]
    return [_line_claim(name, line, statement) for name, line in sorted(lines.items())]


WIDTH_PAIRS = (
    (SWA_PAPER, "sgd", "swag"),
    (FLAT_PAPER, "swag", "fswag"),
    (FLAT_PAPER, "hwa", "fhwa"),
)


def _sharpness_text(c: WidthComparison, checks: list[SharpnessCheck]) -> str:
    if not checks:
        return " No tr(H) or SAM sharpness was measured at both centres."
    parts = [
        f"{k.label} {_with_se(k.wide, k.wide_se)} ({c.wide}) vs "
        f"{_with_se(k.narrow, k.narrow_se)} ({c.narrow}): " + _sharpness_verdict(c, k)
        for k in checks
    ]
    return " At the same centres " + "; ".join(parts) + "."


def _with_se(value: float, se: float) -> str:
    return f"{value:.4g} ± {se:.2g}" if se > 0 else f"{value:.4g}"


def _sharpness_verdict(c: WidthComparison, k: SharpnessCheck) -> str:
    if k.wide_flatter is None and k.wide != k.narrow:
        diff = k.wide - k.narrow
        return f"the same within probe noise ({diff:+.2g}, inside ±{k.noise:.2g}: {NOISE_SE:g} SE)"
    return f"{c.wide} " + {True: "flatter", False: "sharper", None: "equal"}[k.wide_flatter]


def _width_claim(
    paper: str, statement: str, c: WidthComparison, delta: float, checks: list[SharpnessCheck]
) -> Claim:
    """The rays' sign test, overruled to mixed when a sharpness measure says otherwise."""
    censored = f"; {c.censored} width(s) beyond the grid count as its end" if c.censored else ""
    rays = c.verdict
    # The way the rays point: their verdict, else the majority of the untied directions.
    lean = rays if rays is not None else None if c.wider == c.narrower else c.wider > c.narrower
    against = disagreeing(lean, checks)
    p = c.p_wider if c.wider >= c.narrower else c.p_narrower
    text = (
        f"Mean width {c.mean_wide:.2f} ({c.wide}) vs {c.mean_narrow:.2f} ({c.narrow}) at delta "
        f"{delta:g}; {c.wide} is wider in {c.wider} and narrower in {c.narrower} of "
        f"{c.directions} shared directions, {c.ties} within one grid step ({c.tolerance:g}) "
        f"and so tied{censored}; one-sided sign test p = {p:.3g} (ties dropped)."
        f"{_sharpness_text(c, checks)} Rule: holds if wider by at least one grid step in "
        f"most directions with sign test p < {SIGN_TEST_P:g} (at least 5 directions all one "
        "way), does not hold if narrower likewise, else undecided; mixed (undecided) when "
        "tr(H) or the SAM sharpness at the same centres points the other way (tr(H) beyond "
        f"{NOISE_SE:g} standard errors of its probes)."
    )
    counts = f"wider in {c.wider}, narrower in {c.narrower} of {c.directions} (p {p:.3g})"
    undecided = f"undecided ({c.directions} directions): {counts}"
    if not against:
        return Claim(paper, statement, rays, text, counts if rays is not None else undecided)
    names = " and ".join(k.label for k in against)
    way, said = ("sharper", "wider") if lean else ("flatter", "narrower")
    if rays is None:
        text += f" The rays lean {said}; by {names} {c.wide} is {way}."
        return Claim(paper, statement, None, text, f"{undecided}; {names} {way}")
    text += f" Mixed: the rays say {said}, but by {names} {c.wide} is {way}."
    return Claim(paper, statement, None, text, f"mixed: {counts}; {names} {way}")


def _width_claims(inputs: ReportInputs) -> list[Claim]:
    rays = inputs.landscape.rays if inputs.landscape is not None else {}
    out = []
    for paper, narrow, wide in WIDTH_PAIRS:
        statement = f"The {wide} centre lies in a wider region of low train loss than {narrow}'s"
        if narrow not in rays or wide not in rays:
            if paper == SWA_PAPER:
                reason = NO_LANDSCAPE if not rays else f"rays from {narrow} and {wide} missing"
                out.append(Claim(paper, statement, None, f"No widths: {reason}.", "n/a (no rays)"))
            continue
        c = compare_widths(rays[narrow], rays[wide])
        if c is None:
            why = "No ray widths were recorded."
            out.append(Claim(paper, statement, None, why, "n/a (no widths)"))
            continue
        checks = sharpness_checks(
            centre_sharpness(inputs.predictors, rays[narrow]),
            centre_sharpness(inputs.predictors, rays[wide]),
        )
        out.append(_width_claim(paper, statement, c, rays[wide].delta, checks))
    return out


def _sigma_claims(inputs: ReportInputs) -> list[Claim]:
    statement = f"SWAG accuracy stays flat out to {PAPER_FLAT_MULTIPLE:g} sigma from theta_bar"
    swag = inputs.landscape.swag if inputs.landscape is not None else {}
    out = []
    for traj, s in sorted(swag.items()):
        c = sigma_curve_of(s.sigma_distance)
        reach = flat_range(c) if c is not None else None
        if c is None or reach is None:
            why = "No m = 0 row to compare with."
            out.append(Claim(DSWAG, f"{statement} ({traj})", None, why, "n/a (no m = 0 row)"))
            continue
        text = (
            f"{traj}: mean accuracy {100 * c.mean[0]:.2f}% at m = 0 stays within "
            f"{100 * FLAT_TOLERANCE:g} pp up to m = {reach:g}; {100 * c.mean[-1]:.2f}% at "
            f"m = {c.multiples[-1]:g} (||sigma|| {c.sigma_norm:.3g})."
        )
        number = f"flat to m = {reach:g} (grid to m = {c.multiples[-1]:g})"
        out.append(Claim(DSWAG, f"{statement} ({traj})", flat_verdict(c, reach), text, number))
    if not out:
        why = f"No SWAG sigma-distance rows: {NO_LANDSCAPE}."
        out.append(Claim(DSWAG, statement, None, why, "n/a (no landscape)"))
    return out


def _widths_table(inputs: ReportInputs) -> Table | None:
    rays = inputs.landscape.rays if inputs.landscape is not None else {}
    if not rays:
        return None
    n = max(len(r.widths) for r in rays.values())
    rows = []
    for traj, r in rays.items():
        widths = [
            fmt_or_dash(w, WIDTH) if w is not None else f"> {ray_grid_end(r):g}" for w in r.widths
        ]
        mean = sum(ray_widths(r)) / len(r.widths) if r.widths else math.nan
        rows.append(
            [Cell(f"{traj} ({r.centre})"), Cell(fmt_or_dash(mean, WIDTH))]
            + [Cell(w) for w in widths]
        )
    return Table(["Centre", "Mean width", *(f"d{i + 1}" for i in range(n))], rows)


def _sigma_table(inputs: ReportInputs) -> Table | None:
    swag = inputs.landscape.swag if inputs.landscape is not None else {}
    rows = []
    for traj, s in sorted(swag.items()):
        c = sigma_curve_of(s.sigma_distance)
        if c is None:
            continue
        reach = flat_range(c)
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
        m = line_minimum(line)
        if m is not None:
            parts.append(f"on {name} the train loss is lowest at t = {m.t_min:g}")
    rays = inputs.landscape.rays if inputs.landscape else {}
    if rays:
        widest = max(rays, key=lambda k: (sum(ray_widths(rays[k])), k))
        parts.append(f"{widest} has the widest mean ray width")
    return ("On this run " + "; ".join(parts) + ".") if parts else "No line or ray was computed."


CAPTIONS = {
    "analysis_line": (
        "Along w(t) = w_a + t (w_b - w_a) (t = 0: a's centre, t = 1: b's; dotted "
        "lines): the train loss's data term, the loss with the weight-decay term (log scales), and "
        "the train and test error. BatchNorm statistics are recomputed at every t."
    ),
    "analysis_rays": (
        "Train loss (log scale) and test error along the same seeded random "
        "directions from each centre: every direction thin, the mean over directions bold. The "
        "legend gives the mean width (distance at which the loss rose by delta)."
    ),
    "analysis_swag_directions": (
        "Train loss and test accuracy along each SWAG posterior's top "
        "principal directions, in multiples of the standard deviation sigma along each."
    ),
    "analysis_sigma_distance": (
        "Test accuracy of the single network theta_bar + m sigma z "
        "(mean over the draws z, band: min to max) for each SWAG-kind posterior of the pipeline "
        "(solid/dashed) and, dotted grey, each W of the DSWAG sweep (the same points as the DSWAG "
        "figure). Symmetric log x axis, m = 0 is theta_bar."
    ),
}


def claims(inputs: ReportInputs) -> list[Claim]:
    """The section's claims without its figures (what the headline needs)."""
    return [*_line_claims(inputs), *_width_claims(inputs), *_sigma_claims(inputs)]


def _figure(name: str, drawn: Figure | None) -> list[Block]:
    return figure(name, style.png_or_none(drawn), CAPTIONS[name])


def build(inputs: ReportInputs, unc: Uncertainty) -> Section:
    line, width, sigma = _line_claims(inputs), _width_claims(inputs), _sigma_claims(inputs)
    checked = [*line, *width, *sigma]
    blocks: list[Block] = [Heading(2, "Loss landscape")]
    if inputs.landscape is None:
        return Section([*blocks, Paragraph(f"No landscape figures: {NO_LANDSCAPE}.")], checked)
    blocks += [
        Paragraph(_landscape_sentence(inputs)),
        *_figure("analysis_line", figures.line_figure(inputs)),
        claim_bullets(line),
        *_figure("analysis_rays", figures.rays_figure(inputs)),
    ]
    widths = _widths_table(inputs)
    if widths is not None:
        blocks.append(TableBlock(widths))
    blocks += [
        claim_bullets(width),
        *_figure("analysis_swag_directions", figures.swag_directions_figure(inputs)),
        *_figure("analysis_sigma_distance", figures.sigma_distance_figure(inputs)),
    ]
    table = _sigma_table(inputs)
    if table is not None:
        blocks.append(TableBlock(table))
    return Section([*blocks, claim_bullets(sigma)], checked)
