"""The report as one ordered list of blocks, rendered later to HTML and Markdown.

Every section is written here once; the two renderers only decide how a
block looks, so the HTML page and the Markdown twin cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import yaml

from . import distributed, findings
from .figures import FIGURES
from .findings import Cell, Table
from .inputs import ReportInputs


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    kind: str = "heading"


@dataclass(frozen=True)
class Paragraph:
    text: str
    kind: str = "paragraph"


@dataclass(frozen=True)
class Bullets:
    items: list[str]
    kind: str = "bullets"


@dataclass(frozen=True)
class TableBlock:
    table: Table
    kind: str = "table"


@dataclass(frozen=True)
class FigureBlock:
    """A PNG shown with its caption; ``name`` is also its file stem under figures/."""

    name: str
    png: bytes
    caption: str
    kind: str = "figure"


@dataclass(frozen=True)
class Preformatted:
    """Verbatim text (notes, params); ``lang`` tags the Markdown fence."""

    text: str
    lang: str
    kind: str = "pre"


Block = Heading | Paragraph | Bullets | TableBlock | FigureBlock | Preformatted

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
        _bullets(distributed.claims(inputs), "No claim can be checked without the sweep."),
    ]


def build(inputs: ReportInputs, pngs: dict[str, bytes]) -> list[Block]:
    """Every section in report order; ``pngs`` holds the figures that have data."""
    blocks: list[Block] = [
        Heading(1, inputs.title),
        Paragraph(findings.summary(inputs)),
        Heading(2, "Metrics"),
        TableBlock(findings.metrics_table(inputs.predictors)),
        Heading(2, "Baselines and their counterparts"),
    ]
    pairs = findings.pairs_table(inputs)
    if pairs is None:
        blocks.append(Paragraph(findings.NO_PAIRS))
    else:
        blocks += [Paragraph(findings.PAIRS_NOTE), TableBlock(pairs)]
    blocks += [
        Heading(2, "Findings"),
        _bullets(findings.comparison_lines(inputs), "No findings."),
        Heading(2, "Claims as found"),
    ]
    claims = findings.claim_sections(inputs)
    if not claims:
        blocks.append(Paragraph(findings.NO_PAIRS))
    for title, lines in claims:
        blocks += [Heading(3, title), Bullets(lines)]
    blocks += _distributed(inputs, pngs)
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
    runs = Table(
        ["Stage", "MLflow run id"], [[Cell(s), Cell(r)] for s, r in inputs.run_ids.items()]
    )
    blocks += [
        Heading(2, "Tuning"),
        Preformatted(inputs.notes or "No tuning notes were given.", "text"),
        Heading(2, "Parameters"),
        Preformatted(yaml.safe_dump(inputs.params, sort_keys=False), "yaml"),
        Heading(2, "MLflow runs"),
        TableBlock(runs),
    ]
    return blocks
