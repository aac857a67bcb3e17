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
from ...inputs import ReportInputs
from ...sigma_curves import FLAT_TOLERANCE, flat_range, sigma_curve_of
from ...uncertainty import Uncertainty
from . import figures
from .measures import (
    PAPER_FLAT_MULTIPLE,
    compare_widths,
    edge_verdict,
    flat_verdict,
    line_minimum,
    ray_grid_end,
    ray_widths,
)

DSWAG = DSWAG_PAPER


NO_LANDSCAPE = "no landscape analysis was run"
# Ray widths to two decimals: the claims count each direction wider or narrower, and
# two widths that three digits show alike (21.9, 21.9) would read as a tie.
WIDTH = ".2f"


def _line_claims(inputs: ReportInputs) -> list[Claim]:
    statement = "SGD ends at the edge of the basin on the line SGD → SWA, SWA near its centre"
    lines = inputs.landscape.lines if inputs.landscape is not None else {}
    if not lines:
        why = f"No line was computed: {NO_LANDSCAPE}."
        return [Claim(SWA_PAPER, statement, None, why, "n/a (no landscape)")]
    out = []
    for name, line in sorted(lines.items()):
        m = line_minimum(line)
        label = f"{statement} ({name}: {line.a} → {line.b})"
        if m is None:
            why = f"The line {name} has no t = 0 with a point after it."
            out.append(Claim(SWA_PAPER, label, None, why, "n/a (no t = 0)"))
            continue
        slope = "falls" if m.on_slope else "rises" if m.loss_next > m.loss_at_0 else "does not fall"
        text = (
            f"Train loss is lowest at t = {m.t_min:g} ({m.loss_min:.4g}; t = 0 is {line.a}, t = 1 "
            f"{line.b}); from t = 0 ({m.loss_at_0:.4g}) it {slope} to {m.loss_next:.4g} at "
            f"t = {m.t_next:g}. Rule: holds if the minimum lies at t > 0.5 and t = 0 is on a "
            "slope; undecided if the minimum is the grid's last t (the loss still falls beyond b)."
        )
        number = (
            f"loss minimum at t = {m.t_min:g}; {m.loss_at_0:.4g} at t = 0 → "
            f"{m.loss_next:.4g} at t = {m.t_next:g}"
        )
        out.append(Claim(SWA_PAPER, label, edge_verdict(m), text, number))
    return out


WIDTH_PAIRS = (
    (SWA_PAPER, "sgd", "swag"),
    (FLAT_PAPER, "swag", "fswag"),
    (FLAT_PAPER, "hwa", "fhwa"),
)


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
        censored = f"; {c.censored} width(s) beyond the grid count as its end" if c.censored else ""
        text = (
            f"Mean width {c.mean_wide:.2f} ({wide}) vs {c.mean_narrow:.2f} ({narrow}) at delta "
            f"{rays[wide].delta:g}; {wide} is wider in {c.wider} and narrower in {c.narrower} of "
            f"{c.directions} shared directions{censored}. Rule: holds if wider on average and in "
            "most directions."
        )
        number = (
            f"mean width {c.mean_wide:.2f} vs {c.mean_narrow:.2f}; wider in {c.wider} of "
            f"{c.directions}"
        )
        out.append(Claim(paper, statement, c.verdict, text, number))
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
