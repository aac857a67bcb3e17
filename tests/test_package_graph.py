"""The library reads as the pipeline: its packages and root modules, in the data-flow order
the README's map of the code lists them, import only what comes before them (no import
back up the flow, so no import circle), and the root holds at most five modules.

The order is read from the README's table ("The library's rooms"), so the map and the
code cannot drift apart. Imports are read from the source (function-level ones
included), relative imports resolved, as tests/test_report_layout.py does for the report.
"""

from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest
from import_graph import module_imports

import bayesavg

PACKAGE = Path(bayesavg.__file__).parent
README = Path(__file__).resolve().parents[1] / "README.md"
MAX_ROOT_MODULES = 5
TABLE_HEADER = "| where (`src/bayesavg/`) | what |"


def flow_order(readme: str | None = None) -> list[str]:
    """Top-level packages (``data/``) and root modules (``cli.py``) in the order of the map's
    rows, by the names in each row's first cell."""
    lines = (README.read_text(encoding="utf-8") if readme is None else readme).splitlines()
    start = lines.index(TABLE_HEADER) + 2  # the header and its |---| line
    order = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        first = line.split("|")[1]
        order += [name for name, _ in re.findall(r"`(\w+)(/|\.py)`", first)]
    return order


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module of bayesavg."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


MODULES = _modules()


def _unit(name: str) -> str | None:
    """The top-level package or root module a module belongs to (None: bayesavg itself)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


UNITS = sorted({u for n in MODULES if (u := _unit(n)) is not None})


def _imports(name: str) -> set[str]:
    """The bayesavg modules ``name`` imports anywhere in its source, relative imports
    resolved."""
    return module_imports(name, MODULES)


def unit_graph() -> dict[str, dict[str, list[str]]]:
    """Package -> package it imports -> the imports that make that edge (``a -> b``)."""
    graph: dict[str, dict[str, list[str]]] = {u: {} for u in UNITS}
    for name in MODULES:
        for target in _imports(name):
            a, b = _unit(name), _unit(target)
            if a is not None and b is not None and a != b:
                graph[a].setdefault(b, []).append(f"{name} -> {target}")
    return graph


def back_edges(graph: dict[str, dict[str, list[str]]], order: list[str]) -> list[str]:
    """Every import of a package that does not come before the importer in ``order``."""
    rank = {u: i for i, u in enumerate(order)}
    last = len(order)  # a package the order does not list comes last
    return sorted(
        why
        for a, targets in graph.items()
        for b, whys in targets.items()
        if rank.get(b, last) >= rank.get(a, last)
        for why in whys
    )


def cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One import circle between packages, or None."""
    try:
        TopologicalSorter({a: set(b) for a, b in graph.items()}).prepare()
    except CycleError as err:
        return list(err.args[1])
    return None


def test_the_checks_can_fail() -> None:
    """A back edge and a circle are found (the checks below are not vacuous)."""
    graph = {"data": {"report": ["bayesavg.data.x -> bayesavg.report.y"]}, "report": {}}
    assert back_edges(graph, ["data", "report"]) == ["bayesavg.data.x -> bayesavg.report.y"]
    assert back_edges(graph, ["report", "data"]) == []
    graph["report"] = {"data": ["bayesavg.report.y -> bayesavg.data.x"]}
    assert cycle(graph) is not None
    assert flow_order(f"x\n{TABLE_HEADER}\n|---|---|\n| `a/` | . |\n| `b.py`, `c/` | . |\n") == [
        "a",
        "b",
        "c",
    ]


def test_the_readme_maps_every_package_once() -> None:
    order = flow_order()
    assert len(order) == len(set(order)), f"listed twice in the README's map: {order}"
    assert set(order) == set(UNITS), (
        f"README's map lists {sorted(set(order) - set(UNITS))} that do not exist and misses "
        f"{sorted(set(UNITS) - set(order))}"
    )


def test_no_import_circle_between_packages() -> None:
    found = cycle(unit_graph())
    assert found is None, " -> ".join(found or [])


def test_no_import_back_up_the_flow() -> None:
    """Each package imports only packages the README's map lists before it."""
    back = back_edges(unit_graph(), flow_order())
    assert not back, "imports back up the flow (README order):\n" + "\n".join(back)


def test_the_root_holds_at_most_five_modules() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"modules at the root of bayesavg: {root}"


@pytest.mark.parametrize("package", sorted(u for u in UNITS if (PACKAGE / u).is_dir()))
def test_every_package_says_what_it_holds(package: str) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
    assert doc, f"{package}/__init__.py has no docstring"
