"""What a report is made of: tables, blocks, and the ``Section`` every section module builds.

The renderers only decide how a block looks, so the HTML page and the Markdown twin
cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from .claims import Claim, finding_text


class Cell(NamedTuple):
    """One table cell; bold marks the best value or an improvement."""

    text: str
    bold: bool = False


class Table(NamedTuple):
    """A header and rows of cells, the same for HTML and Markdown; ``text_columns``: how
    many leading columns hold text (left-aligned in HTML), the rest numbers (right)."""

    header: list[str]
    rows: list[list[Cell]]
    text_columns: int = 1


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


@dataclass(frozen=True)
class Details:
    """Blocks collapsed under a one-line ``summary`` (HTML ``<details>``, in both files)."""

    summary: str
    blocks: list[Block]
    kind: str = "details"


Block = Heading | Paragraph | Bullets | TableBlock | FigureBlock | Preformatted | Details


@dataclass(frozen=True)
class Section:
    """What a section module's ``build(inputs, unc)`` returns: its blocks in reading order
    and the papers' claims it checks, which the headline lists."""

    blocks: list[Block]
    claims: list[Claim] = field(default_factory=list)


def walk(blocks: list[Block]) -> Iterator[Block]:
    """Every block in reading order, those inside a ``Details`` too."""
    for block in blocks:
        yield block
        if isinstance(block, Details):
            yield from walk(block.blocks)


def bullets_or(lines: list[str], empty: str) -> Block:
    """A list, or a sentence saying there is nothing to list."""
    return Bullets(lines) if lines else Paragraph(empty)


def claim_bullets(found: list[Claim]) -> Bullets:
    """An analysis section's claims, one bullet each."""
    return Bullets([finding_text(c) for c in found])


def figure_section(
    name: str, png: bytes | None, caption: str, table: Table | None = None
) -> list[Block]:
    """A figure under its own heading, with the table of its key numbers below it; nothing
    when the figure has no data."""
    if png is None:
        return []
    blocks: list[Block] = [Heading(2, f"Figure: {name}"), FigureBlock(name, png, caption)]
    return blocks + ([TableBlock(table)] if table is not None else [])


def figure(name: str, png: bytes | None, caption: str) -> list[Block]:
    """A figure inside a section, without a heading; nothing when it has no data."""
    return [FigureBlock(name, png, caption)] if png is not None else []
