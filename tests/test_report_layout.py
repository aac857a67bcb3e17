"""The report's shape: one module per section, each with the same ``build``, listed once in
``document``, importing no other section, and no import circle in the package."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
from import_graph import module_imports

import bayesavg.report as report
from bayesavg.report import document
from bayesavg.report.blocks import Section

ROOT = Path(report.__file__).parent
SECTIONS = "bayesavg.report.sections"


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module of the report package."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The report modules ``name`` imports, relative imports resolved."""
    return module_imports(name, MODULES)


GRAPH = {name: _imports(name) for name in MODULES}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def _section_of(name: str) -> str | None:
    """The top-level section a module belongs to (``shift`` for ``sections.shift.measures``)."""
    if not name.startswith(SECTIONS + "."):
        return None
    return name[len(SECTIONS) + 1 :].split(".")[0]


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_circle_in_the_report() -> None:
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH) or [])


def test_every_module_imports() -> None:
    for name in MODULES:
        importlib.import_module(name)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _section_of(n)))
def test_a_section_imports_no_other_section(name: str) -> None:
    others = {m for m in GRAPH[name] if _section_of(m) not in (None, _section_of(name))}
    assert not others, f"{name} imports {sorted(others)}"


def test_shared_modules_import_no_section() -> None:
    shared = [n for n in MODULES if _section_of(n) is None and n != document.__name__]
    for name in shared:
        found = {m for m in GRAPH[name] if _section_of(m) is not None}
        assert not found or name == report.__name__, f"{name} imports {sorted(found)}"


def test_every_section_is_listed_once_with_one_shape() -> None:
    """Each entry of ``document.BODY`` is ``build(inputs, unc) -> Section`` of a section
    module, listed once; every section module but the headline is listed."""
    listed = [entry.__module__ for entry in document.BODY]
    assert len(set(document.BODY)) == len(document.BODY)
    for entry in document.BODY:
        assert list(inspect.signature(entry).parameters) == ["inputs", "unc"], entry
        assert inspect.signature(entry).return_annotation in (Section, "Section"), entry
    tops = {_section_of(n) for n in MODULES if _section_of(n)}
    assert tops - {_section_of(m) for m in listed} == {"headline"}
