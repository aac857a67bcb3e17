"""The imports between a package's modules, read from their source (the report's layout
test and the library's package-graph test)."""

from __future__ import annotations

import ast
from pathlib import Path


def module_imports(name: str, modules: dict[str, tuple[Path, bool]]) -> set[str]:
    """The modules of ``modules`` (dotted name -> (path, is a package)) that ``name``
    imports anywhere in its source, functions included, relative imports resolved."""
    path, package = modules[name]
    here = name.split(".") if package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # `from . import style` imports the module style
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m in modules and m != name}
