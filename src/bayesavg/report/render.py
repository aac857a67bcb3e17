"""The document's blocks as HTML and Markdown (Jinja2 templates), and the report files.

Both templates walk the same block list (``document.build``); they only
decide how a block looks. HTML is autoescaped and self-contained: CSS and
figures are inline, nothing is fetched. Markdown escapes ``|`` in table
cells and fences verbatim text with more backticks than it contains.
"""

from __future__ import annotations

import base64
import functools
import re
from pathlib import Path

import jinja2

from ..runtime.io import write_bytes, write_text
from . import document
from .blocks import Block, FigureBlock, Heading, walk
from .inputs import ReportInputs


def _fence(text: str, lang: str) -> str:
    """A Markdown code fence longer than any backtick run in ``text``, so it stays verbatim."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _md_cell(text: str) -> str:
    """A table cell's text with ``|`` escaped, so it cannot split the row."""
    return text.replace("|", "\\|")


@functools.cache
def _environment(html: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("bayesavg.report", "templates"),
        autoescape=html,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        b64=lambda data: base64.b64encode(data).decode("ascii"),
        fence=_fence,
        md_cell=_md_cell,
    )
    return env


def _title(blocks: list[Block]) -> str:
    return next(b.text for b in blocks if isinstance(b, Heading) and b.level == 1)


def to_html(blocks: list[Block]) -> str:
    """The self-contained page."""
    template = _environment(True).get_template("report.html.j2")
    return template.render(blocks=blocks, title=_title(blocks))


def to_markdown(blocks: list[Block]) -> str:
    """The Markdown twin; figures link to ``figures/<name>.png`` next to it."""
    return _environment(False).get_template("report.md.j2").render(blocks=blocks)


def write_report(inputs: ReportInputs, out_dir: Path) -> dict[str, Path]:
    """Write report.html, report.md and figures/*.png; return their paths by name."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    blocks = document.build(inputs)
    paths: dict[str, Path] = {}
    for block in walk(blocks):
        if isinstance(block, FigureBlock):
            paths[block.name] = out_dir / "figures" / f"{block.name}.png"
            write_bytes(paths[block.name], block.png)
    paths["md"] = out_dir / "report.md"
    write_text(paths["md"], to_markdown(blocks))
    paths["html"] = out_dir / "report.html"
    write_text(paths["html"], to_html(blocks))
    return paths
