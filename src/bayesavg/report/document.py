"""The report as one ordered list of sections; rendered later to HTML and Markdown.

Every section is a module of ``sections`` with the same ``build(inputs, unc) ->
Section``; adding one is a module and a line in ``BODY``. The headline is built
last, from every section's claims, and shown first. The sections are built side by
side (``parallel``), a module's together, and put back in ``BODY``'s order.
"""

from __future__ import annotations

from collections.abc import Callable

from . import parallel
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

Builder = Callable[[ReportInputs, Uncertainty], Section]

BODY: tuple[Builder, ...] = (
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
    groups = _groups()
    built = parallel.fork_map(_build_group, [(inputs, unc, group) for group in groups])
    by_builder = {
        builder: section
        for group, sections in zip(groups, built, strict=True)
        for builder, section in zip(group, sections, strict=True)
    }
    body = [by_builder[builder] for builder in BODY]
    claims = [claim for section in body for claim in section.claims]
    return [
        Heading(1, inputs.title),
        *headline.build(inputs, unc, claims).blocks,
        *(block for section in body for block in section.blocks),
    ]


def _groups() -> list[tuple[Builder, ...]]:
    """``BODY``'s builders by module, in order of first appearance: a module's sections
    share what it computes once per inputs (``per_inputs``), so they run in one process."""
    groups: dict[str, list[Builder]] = {}
    for builder in BODY:
        groups.setdefault(builder.__module__, []).append(builder)
    return [tuple(group) for group in groups.values()]


def _build_group(job: tuple[ReportInputs, Uncertainty, tuple[Builder, ...]]) -> list[Section]:
    inputs, unc, group = job
    return [builder(inputs, unc) for builder in group]
