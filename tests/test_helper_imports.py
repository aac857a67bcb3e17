"""Every ``from M import name`` in the project's script folders names something M has.

The benchmarks, the GPU check and the stages import one another's helpers and the
package's names, often inside functions, and most of them never run in the default
suite (a benchmark takes minutes, the GPU check needs a GPU): when a helper moved to
another module, `make bench` broke without a test noticing (`benchmarks/reference.py`
imported `reference_package` from `gpu_check_throughput` after it had moved to
`gpu_check_reference`). This reads every such import, at any depth, and checks the name
against what the module defines or imports at its top level (or, for a package, its
submodules).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("benchmarks", "scripts", "stages")
# where a script's bare imports resolve: its own folder first (Python puts it first on
# sys.path), then the folders the scripts add
SEARCH = ("scripts", "tests", "stages", "benchmarks")


@functools.cache
def _top_level_names(path: Path) -> frozenset[str]:
    """Names bound at a module's top level, in if/try/with blocks too, not in functions."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(node, field, None) or [])
            for handler in getattr(node, "handlers", None) or []:
                visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    return frozenset(names)


def _resolve(module: str, importer: Path) -> Path | None:
    """The file ``module`` names: a sibling script's, or one of the package's own."""
    if module.split(".")[0] == "bayesavg":
        base = ROOT / "src" / Path(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None
    for folder in (importer.parent, *(ROOT / d for d in SEARCH)):
        candidate = folder / f"{module}.py"
        if candidate.is_file():
            return candidate
    return None


def _imports(importer: Path) -> list[tuple[int, Path, str]]:
    """(line, module file, name) for every import of a sibling script's or the package's
    name in ``importer``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(importer.read_text())):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        target = _resolve(node.module, importer)
        if target is not None:
            found += [(node.lineno, target, a.name) for a in node.names]
    return found


def _has(target: Path, name: str) -> bool:
    """``name`` is bound at ``target``'s top level, or is a submodule of its package."""
    if name in _top_level_names(target):
        return True
    package = target.parent if target.name == "__init__.py" else None
    return package is not None and (
        (package / f"{name}.py").is_file() or (package / name / "__init__.py").is_file()
    )


IMPORTERS = sorted(p for folder in SOURCES for p in (ROOT / folder).glob("*.py"))


def test_there_are_such_imports_to_check() -> None:
    pairs = {(p.name, t.name) for p in IMPORTERS for _, t, _ in _imports(p)}
    assert ("reference.py", "gpu_check_reference.py") in pairs
    assert ("outage.py", "pipeline_repo.py") in pairs
    assert ("landscape.py", "_common.py") in pairs
    assert ("reference.py", "precision.py") in pairs  # bayesavg.training.precision


@pytest.mark.parametrize("importer", IMPORTERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_imported_name_exists_where_it_is_imported_from(importer: Path) -> None:
    missing = [
        f"{importer.relative_to(ROOT)}:{line} imports {name!r} from "
        f"{target.relative_to(ROOT)}, which has no such name"
        for line, target, name in _imports(importer)
        if not _has(target, name)
    ]
    assert not missing, "\n".join(missing)


def test_the_check_sees_a_moved_name(tmp_path: Path) -> None:
    """The check itself: a name that lives elsewhere, or only inside a function, is absent."""
    module = tmp_path / "helpers.py"
    module.write_text(
        "import os\nfrom x import y as z\nA = 1\nif A:\n    B = 2\n"
        "try:\n    C = 3\nexcept ImportError:\n    D = 4\n"
        "def f():\n    hidden = 1\nclass K:\n    attr = 2\n"
    )
    names = _top_level_names(module)
    assert {"os", "z", "A", "B", "C", "D", "f", "K"} <= names
    assert not {"y", "hidden", "attr"} & names
