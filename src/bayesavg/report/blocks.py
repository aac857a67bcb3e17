"""The block types a report is made of; every section builds a list of them.

Kept apart from ``document`` so that section modules (headline, analyses)
can build blocks without importing the document that imports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .findings import Table


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
