"""The report as one ordered list of blocks, rendered later to HTML and Markdown.

Every section is written here once; the two renderers only decide how a
block looks, so the HTML page and the Markdown twin cannot drift apart.
The block types live in ``blocks`` (re-exported here), so that section
modules such as ``analyses`` can build blocks without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable

import yaml

from . import distributed, findings, headline
from .blocks import Block, Bullets, FigureBlock, Heading, Paragraph, Preformatted, TableBlock
from .figures import FIGURES
from .findings import Cell, Table
from .inputs import ReportInputs
from .uncertainty import Uncertainty, compute

__all__ = [
    "Block",
    "Bullets",
    "FigureBlock",
    "Heading",
    "Paragraph",
    "Preformatted",
    "TableBlock",
    "build",
]


# Tables that give a figure's key numbers in text, shown right under the figure.
_FIGURE_TABLES: dict[str, Callable[[ReportInputs], Table | None]] = {
    "sigma": lambda inputs: findings.sigma_table(inputs.predictors),
    "dswag_rounds": lambda inputs: distributed.rounds_table(inputs.dswag_sweep),
    "dswag_sigma_distance": lambda inputs: distributed.sigma_table(inputs.dswag_sweep),
    "dswag_workers": lambda inputs: distributed.sweep_table(inputs.dswag_sweep),
}


def _bullets(lines: list[str], empty: str) -> Block:
    """A list, or a sentence saying there is nothing to list."""
    return Bullets(lines) if lines else Paragraph(empty)


def _distributed(inputs: ReportInputs, pngs: dict[str, bytes]) -> list[Block]:
    """The DSWAG paper's claims as found; nothing without a dswag trajectory or sweep."""
    overview = distributed.overview(inputs)
    if overview is None:
        return []
    figures = [name for name in pngs if name.startswith("dswag_")]
    where = f" The figures {', '.join(figures)} below show the numbers." if figures else ""
    return [
        Heading(2, "Distributed SWAG"),
        Paragraph(overview + where),
        Paragraph(distributed.SIGN_NOTE),
        Heading(3, "The paper's claims on this data"),
        _bullets(
            [headline.claim_text(c) for c in distributed.claims(inputs)],
            "No claim can be checked without the sweep.",
        ),
    ]


def _comparisons(inputs: ReportInputs, unc: Uncertainty) -> list[Block]:
    """Every predictor against the baseline, then every counterpart against its reference."""
    pairs = findings.pair_lines(inputs, unc)
    return [
        Heading(2, "Comparisons"),
        Paragraph(findings.COMPARISONS_NOTE),
        Heading(3, f"Against the baseline {inputs.baseline}"),
        _bullets(findings.baseline_lines(inputs, unc), "No other predictor."),
        Heading(3, "Counterparts against their references"),
        _bullets(pairs, findings.NO_PAIRS),
    ]


def _metrics(inputs: ReportInputs, unc: Uncertainty) -> list[Block]:
    blocks: list[Block] = [
        Heading(2, "Metrics"),
        Paragraph(findings.metrics_note(inputs.predictors, unc)),
        TableBlock(findings.metrics_table(inputs.predictors, unc)),
    ]
    geometry = findings.geometry_table(inputs.predictors)
    if geometry is not None:
        blocks += [Paragraph(findings.GEOMETRY_NOTE), TableBlock(geometry)]
    return blocks


def _figures(inputs: ReportInputs, pngs: dict[str, bytes]) -> list[Block]:
    blocks: list[Block] = []
    for spec in FIGURES:
        if spec.name not in pngs:
            continue
        blocks += [
            Heading(2, f"Figure: {spec.name}"),
            FigureBlock(spec.name, pngs[spec.name], spec.caption),
        ]
        numbers = _FIGURE_TABLES.get(spec.name, lambda _: None)(inputs)
        if numbers is not None:
            blocks.append(TableBlock(numbers))
    return blocks


def _appendix(inputs: ReportInputs) -> list[Block]:
    """Tuning notes, the parameters and where the MLflow runs are: how to reproduce the run."""
    runs = Table(
        ["MLflow search filter, per run"],
        [[Cell(f"attributes.run_name = '{name}'")] for name in inputs.runs],
    )
    return [
        Heading(2, "Tuning"),
        Preformatted(inputs.notes or "No tuning notes were given.", "text"),
        Heading(2, "Parameters"),
        Preformatted(yaml.safe_dump(inputs.params, sort_keys=False), "yaml"),
        Heading(2, "MLflow runs"),
        Paragraph(
            "Every stage is an MLflow run named after it, or one per unit where a stage runs "
            "several (evaluate@TRAJECTORY: a run per predictor; dswag_sweep: per W; "
            "landscape: per probe; pretrain: also init), tagged dvc_stage with the stage; each "
            "pipeline execution is one parent run over them. Run ids change with every "
            "execution, so they are not in this report, whose bytes a rerun reproduces: this "
            "workspace's are in runs/RUN.json, and each run's executions are found by its filter "
            "below."
        ),
        TableBlock(runs),
    ]


def build(inputs: ReportInputs, pngs: dict[str, bytes]) -> list[Block]:
    """Every section in report order; ``pngs`` holds the figures that have data.

    The headline comes first; the analyses (``analyses``, imported here since it
    builds its blocks from this module's types) follow the comparisons and figures.
    """
    from . import analyses

    unc = compute(inputs)
    return [
        Heading(1, inputs.title),
        *headline.blocks(inputs, unc, analyses.claims(inputs)),
        Heading(2, "Setup"),
        Paragraph(findings.summary(inputs)),
        *_metrics(inputs, unc),
        *_comparisons(inputs, unc),
        *_distributed(inputs, pngs),
        *_figures(inputs, pngs),
        *analyses.sections(inputs, pngs),
        *_appendix(inputs),
    ]
