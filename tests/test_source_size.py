"""No source file over 400 lines: a module a newcomer opens reads on a few screens."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("src", "stages", "benchmarks", "scripts")
MAX_LINES = 400


def test_no_source_file_is_over_400_lines() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *FOLDERS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    files = [ROOT / name for name in listed if name.endswith(".py") and (ROOT / name).exists()]
    assert files, "no source files found"
    long = {
        str(f.relative_to(ROOT)): n
        for f in files
        if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"
