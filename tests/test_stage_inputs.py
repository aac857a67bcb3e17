"""A stage whose input file is missing (its upstream stage was interrupted, or it was run
by hand first) says so in one line, before any work, instead of a FileNotFoundError."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
