"""``bayesavg`` run in-process by the CLI tests: a success's metrics, a user error's line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bayesavg.cli import main


def run_ok(args: list[str], out: Path) -> dict[str, Any]:
    """Run expecting success; the metrics JSON it wrote to ``out``."""
    main(args)
    return json.loads(out.read_text())


def user_error_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run expecting exit code 2 and exactly one ``error:`` line on stderr, no traceback;
    return that line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("error: "), err
    return err.rstrip("\n")
