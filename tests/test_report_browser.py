"""The report loads in a real headless Chromium: no console error, every image decodes.

``scripts/check_report.py`` does the check; these tests run it on a synthetic
report and on deliberately broken pages, so the check itself is tested.
Without a Chromium binary they are skipped with the install hint (see
``_browser_or_skip``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_report import _inputs, no_analyses  # noqa: F401 (autouse: analyses pinned)

from bayesavg.report import write_report

SCRIPT = Path(__file__).parents[1] / "scripts" / "check_report.py"
_PIXEL = (  # a valid 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
    "AAAABJRU5ErkJggg=="
)


def _browser_or_skip() -> None:
    """The one place that decides. A machine with only Python and pip (the README's set-up)
    has no Chromium and pip cannot install Debian's: there the check is skipped, saying how
    to get it; BAYESAVG_REQUIRE_BROWSER=1 (CI, where Chromium is installed) makes a missing
    browser a failure instead."""
    sys.path.insert(0, str(SCRIPT.parent))
    from check_report import INSTALL_HINT, find_browser

    if find_browser() is not None:
        return
    if os.environ.get("BAYESAVG_REQUIRE_BROWSER") == "1":
        pytest.fail(INSTALL_HINT + " (BAYESAVG_REQUIRE_BROWSER=1)")
    pytest.skip("no Chromium on this machine: " + INSTALL_HINT)


def _check(page: Path) -> subprocess.CompletedProcess[str]:
    _browser_or_skip()
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(page)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(_inputs(), tmp_path_factory.mktemp("browser"))["html"]


def test_the_report_loads_cleanly(report: Path) -> None:
    done = _check(report)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("3 images, 0 console errors")


def test_a_corrupt_image_fails(report: Path, tmp_path: Path) -> None:
    page = report.read_text(encoding="utf-8").replace("base64,", "base64,AAAA", 1)
    broken = tmp_path / "broken.html"
    broken.write_text(page, encoding="utf-8")
    done = _check(broken)
    assert done.returncode == 1
    assert "image not loaded: reliability" in done.stdout.splitlines()


def test_a_script_error_fails(tmp_path: Path) -> None:
    page = tmp_path / "throw.html"
    page.write_text(
        f'<html><head></head><body><img src="data:image/png;base64,{_PIXEL}" alt="dot">'
        '<script>throw new Error("x")</script></body></html>',
        encoding="utf-8",
    )
    done = _check(page)
    assert done.returncode == 1
    assert any("Uncaught Error: x" in line for line in done.stdout.splitlines())


def test_a_page_without_images_fails(tmp_path: Path) -> None:
    page = tmp_path / "empty.html"
    page.write_text("<html><head></head><body><p>nothing</p></body></html>", encoding="utf-8")
    done = _check(page)
    assert done.returncode == 1 and "no images on the page" in done.stdout
