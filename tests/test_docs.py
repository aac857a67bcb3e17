"""The definitions the code and README cite are in the repository, whole: a user of a
clone has ``docs/ALGORITHMS.md`` and ``docs/DESIGN.md``, not the team's notes beside it."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline_repo import ROOT

DOCS = ("ALGORITHMS.md", "DESIGN.md")


def _cited() -> set[int]:
    """Every section number cited as ``ALGORITHMS §N`` (or ``§N-M``) in the README and
    the sources."""
    files = [
        ROOT / "README.md",
        *sorted(ROOT.glob("src/**/*.py")),
        *sorted(ROOT.glob("stages/*.py")),
    ]
    found: set[int] = set()
    for file in files:
        for first, last in re.findall(r"ALGORITHMS §(\d+)(?:-(\d+))?", file.read_text()):
            found.update(range(int(first), int(last or first) + 1))
    return found


def test_every_cited_section_of_algorithms_is_in_the_copy() -> None:
    headings = re.findall(r"^## (\d+)\. ", (ROOT / "docs" / "ALGORITHMS.md").read_text(), re.M)
    cited = _cited()
    assert len(cited) >= 8, cited  # the README and sources cite most of them
    assert cited <= {int(h) for h in headings}, cited - {int(h) for h in headings}


def test_the_copies_are_the_team_s_notes_where_those_are_beside_the_clone() -> None:
    """The team keeps the notes in ``../shared``; a copy behind them would mislead."""
    for name in DOCS:
        copy = (ROOT / "docs" / name).read_text()
        assert copy.startswith("# "), name
        shared = Path(ROOT.parent, "shared", name)
        if shared.is_file():
            assert copy == shared.read_text(), f"docs/{name} differs from {shared}: copy it again"
