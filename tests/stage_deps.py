"""What each DVC stage's command can import from the project, and what dvc.yaml declares.

Shared by the static check (tests/test_dvc_deps.py, every import the code
can reach, function-level imports included) and the traced check of the
end-to-end run (tests/test_pipeline.py, what the stage really imported and
opened).
"""

from __future__ import annotations

import re
from modulefinder import ModuleFinder
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def stage_bodies(dvc_yaml: Path = ROOT / "dvc.yaml") -> dict[str, dict[str, Any]]:
    """Each stage (a foreach's ``do`` body for templated ones) by its dvc.yaml name."""
    stages = yaml.safe_load(dvc_yaml.read_text())["stages"]
    return {name: stage.get("do", stage) for name, stage in stages.items()}


def script_of(cmd: str) -> str:
    """The stage script a ``python stages/<name>.py ...`` command runs."""
    match = re.match(r"python (stages/\w+\.py)\b", cmd)
    if match is None:
        raise ValueError(f"not a stage command: {cmd!r}")
    return match[1]


def import_closure(script: str, root: Path = ROOT) -> set[str]:
    """Project files (relative paths) that ``script`` imports, directly or not.

    ModuleFinder reads bytecode, so imports inside functions count too; only
    ``stages/`` and ``src/`` are searched, so third-party packages are not
    followed (they are pinned by pyproject.toml, not by dvc.yaml).
    """
    finder = ModuleFinder(path=[str(root / "stages"), str(root / "src")])
    finder.run_script(str(root / script))
    files = {script}
    for module in finder.modules.values():
        if module.__file__:
            path = Path(module.__file__).resolve()
            if path.is_relative_to(root):
                files.add(path.relative_to(root).as_posix())
    return files


def covered(path: str, deps: list[str]) -> bool:
    """Whether ``path`` is a declared dep or lies inside a declared directory dep."""
    return any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)
