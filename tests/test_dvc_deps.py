"""dvc.yaml declares exactly the project code each stage's command can import.

A change to any file a stage imports must make `dvc status` report that
stage as changed; a file it does not import must not rerun it. The import
closure is read statically (ModuleFinder), so imports inside functions
count. What the stages really open at run time is checked by the traced
end-to-end run in test_pipeline.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from stage_deps import ROOT, covered, import_closure, script_of, stage_bodies

STAGES = stage_bodies()
CODE_DIRS = ("src/", "stages/")
# Code a stage reads as data, never imports: the MLflow model's code file, which the
# evaluate stages log as the model (MLflow runs it only where the model is loaded).
READ_AS_DATA = {"evaluate": {"src/bayesavg/mlflow_model.py"}}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_imported_project_file_is_a_dep(stage: str) -> None:
    body = STAGES[stage]
    deps = body.get("deps", [])
    closure = import_closure(script_of(body["cmd"]))
    missing = sorted(path for path in closure if not covered(path, deps))
    assert not missing, f"{stage}: add to its deps in dvc.yaml: {missing}"


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_no_code_dep_the_stage_does_not_import(stage: str) -> None:
    """Precise deps: a code dep (file, or directory of Python files) is imported."""
    body = STAGES[stage]
    closure = import_closure(script_of(body["cmd"]))
    extra = []
    for dep in body.get("deps", []):
        if not dep.startswith(CODE_DIRS):
            continue
        path = ROOT / dep
        assert path.exists(), f"{stage}: dep {dep} does not exist"
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        extra += [
            f.relative_to(ROOT).as_posix()
            for f in files
            if f.relative_to(ROOT).as_posix() not in closure | READ_AS_DATA.get(stage, set())
        ]
    assert not extra, f"{stage}: dvc.yaml declares code it does not import: {extra}"


def test_closure_follows_imports_inside_functions(tmp_path: Path) -> None:
    """The check would see a lazy import: a function-level import is in the closure."""
    (tmp_path / "stages").mkdir()
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "src" / "pkg" / "lazy.py").write_text("X = 1\n")
    (tmp_path / "stages" / "s.py").write_text("def run():\n    from pkg import lazy\n")
    closure = import_closure("stages/s.py", root=tmp_path)
    assert closure == {"stages/s.py", "src/pkg/__init__.py", "src/pkg/lazy.py"}


def test_a_changed_dep_makes_the_stage_stale() -> None:
    """The deps the check demands are the ones DVC hashes: every code dep of
    evaluate@* includes the sampling code, so a fix to SWAG.sample reruns
    every SWAG metric."""
    deps = STAGES["evaluate"]["deps"]
    for path in ("src/bayesavg/posteriors/swag.py", "src/bayesavg/predictors/sampling.py"):
        assert covered(path, deps), path


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_config_reaches_every_stage(stage: str) -> None:
    """validate's constant output must not hide a change in config/ (defaults, rules):
    every stage, whose params it governs, depends on it directly."""
    for module in sorted((ROOT / "src/bayesavg/config").glob("*.py")):
        assert covered(module.relative_to(ROOT).as_posix(), STAGES[stage]["deps"]), module.name
