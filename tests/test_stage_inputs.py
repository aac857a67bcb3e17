"""A stage whose input file is missing (its upstream stage was interrupted, or it was run
by hand first) says so in one line, before any work, instead of a FileNotFoundError."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bayesavg.data.prepared import load_prepared, read_manifest
from bayesavg.runtime.errors import UserError

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys; path = sys.argv[1]; sys.argv = ['stages/validate.py']; sys.path.insert(0, 'stages')
import _common
from pathlib import Path
from bayesavg.runtime.errors import UserError
try:
    _common.digest(Path(path))
except UserError as err:
    print(err)
"""


def test_a_missing_input_is_named_with_what_to_run() -> None:
    missing = "models/nowhere/posterior.pt"
    out = subprocess.run(
        [sys.executable, "-c", PROBE, missing], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out == (
        f"{missing} is missing: run the stage that writes it first (dvc repro runs what a "
        "stage needs)\n"
    )


def _manifest(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(text)
    return folder


GOOD = json.dumps(
    {
        "dataset": "mnist5k",
        "splits": {
            s: {"file": f"{s}.pt", "sha256": "00", "n": 3} for s in ("train", "val", "test")
        },
    }
)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{not json", "cannot read"),
        ("[1, 2]", "is not a data stage manifest (no dataset name or splits)"),
        ('{"dataset": "mnist5k"}', "is not a data stage manifest (no dataset name or splits)"),
        (GOOD.replace('"n": 3}', '"n": "3"}', 1), "(split 'train' lacks n)"),
        (GOOD.replace('"val": {', '"valid": {'), "(split 'val' lacks file, sha256, n)"),
    ],
)
def test_a_damaged_manifest_is_one_line_for_every_reader(
    tmp_path: Path, text: str, said: str
) -> None:
    """The stages that log the splits as MLflow datasets (``read_manifest``) and those
    that load them (``load_prepared``) refuse it alike."""
    folder = _manifest(tmp_path / "prepared", text)
    for read in (lambda: read_manifest(folder / "manifest.json"), lambda: load_prepared(folder)):
        with pytest.raises(UserError) as refused:
            read()
        message = str(refused.value)
        assert said in message and "\n" not in message and "data stage" in message


def test_a_split_file_missing_beside_its_manifest_is_one_line(tmp_path: Path) -> None:
    folder = _manifest(tmp_path / "prepared", GOOD)
    with pytest.raises(UserError, match=r"train\.pt is missing; rerun the data stage"):
        load_prepared(folder)


PROBE_MANIFEST = """
import sys; path = sys.argv[1]; sys.argv = ['stages/validate.py']; sys.path.insert(0, 'stages')
import _common
from pathlib import Path
from bayesavg.runtime.errors import UserError
try:
    _common.prepared_datasets(Path(path))
except UserError as err:
    print(err)
"""


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"dataset": "m"}', GOOD[:-30] + "}}"])
def test_a_damaged_manifest_is_one_line_where_a_stage_logs_its_splits(
    tmp_path: Path, text: str
) -> None:
    manifest = _manifest(tmp_path / "prepared", text) / "manifest.json"
    out = subprocess.run(
        [sys.executable, "-c", PROBE_MANIFEST, str(manifest)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith(f"cannot read {manifest} (") and out.count("\n") == 1, out
    assert out.endswith("); rerun the data stage\n")


def test_the_pipeline_refuses_params_without_predictors(tmp_path: Path) -> None:
    """Valid for the library (a fine-tuning-only config), but the pipeline's evaluate
    stages would all vanish: the validate stage says so before anything runs."""
    import yaml

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["evaluate"]["predictors"] = {}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    done = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "validate.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "error: params.yaml: evaluate.predictors: none listed; the pipeline evaluates them\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
