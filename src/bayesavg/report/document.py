"""The report as one ordered list of sections; rendered later to HTML and Markdown.

Every section is a module of ``sections`` with the same ``build(inputs, unc) ->
Section``; adding one is a module and a line in ``BODY``. The headline is built
last, from every section's claims, and shown first.
"""

from __future__ import annotations

from collections.abc import Callable

from .blocks import Block, Heading, Section
from .inputs import ReportInputs
from .sections import (
    appendix,
    baselines,
    calibration,
    comparisons,
    corrupted,
    distributed,
    headline,
    landscape,
    metrics,
    ood,
    plane,
    samples,
    seeds,
    selective,
    setup,
    sharpness,
    shift,
    training,
    variational,
)
from .uncertainty import Uncertainty, compute

BODY: tuple[Callable[[ReportInputs, Uncertainty], Section], ...] = (
    setup.build,
    metrics.build,
    seeds.build,
    comparisons.build,
    baselines.build,
    distributed.build,
    calibration.build,
    selective.build,
    samples.build,
    training.build,
    variational.build,
    plane.build,
    distributed.build_figures,
    shift.build,
    corrupted.build,
    ood.build,
    landscape.build,
    sharpness.build,
    appendix.build,
)


def build(inputs: ReportInputs) -> list[Block]:
    """Every block in report order: the title, the headline, then ``BODY``."""
    unc = compute(inputs)
    body = [section(inputs, unc) for section in BODY]
    claims = [claim for section in body for claim in section.claims]
    return [
        Heading(1, inputs.title),
        *headline.build(inputs, unc, claims).blocks,
        *(block for section in body for block in section.blocks),
    ]
