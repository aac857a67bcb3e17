"""Load an HTML report in headless Chromium; fail on console errors or images that do not load.

A copy of the page gets a script that, once the page has loaded, checks every
<img> (complete, naturalWidth > 0), collects uncaught errors, and writes a
JSON verdict into the DOM, which Chromium dumps. Console errors from
Chromium's log (failed resources, JS errors before the script ran) count too.
Usage: ``python scripts/check_report.py reports/report.html``; exit 0 with one
OK line, else 1 with one line per problem (2 when no browser is found).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
INSTALL_HINT = "no Chromium found: apt-get install chromium (or set BAYESAVG_CHROMIUM)"
_MARKER = "bayesavg-check"
# Installed before anything else on the page, so errors of later scripts are caught.
_EARLY = (
    "<script>window.__errors=[];window.addEventListener('error',function(e){"
    "window.__errors.push(e.message||('failed to load '+(e.target&&e.target.src)))},true);"
    "</script>"
)
_LATE = (
    "<script>window.addEventListener('load',function(){var imgs=document.images,bad=[];"
    "for(var i=0;i<imgs.length;i++){if(!(imgs[i].complete&&imgs[i].naturalWidth>0))"
    "bad.push(imgs[i].alt||('image '+i))}"
    f"var pre=document.createElement('pre');pre.id='{_MARKER}';"
    "pre.textContent=JSON.stringify({images:imgs.length,broken:bad,errors:window.__errors});"
    "document.body.appendChild(pre)});</script>"
)
_CONSOLE = re.compile(r"CONSOLE.*?\] \"?(.*)|Uncaught (.*)")


def find_browser() -> str | None:
    """The browser binary: ``BAYESAVG_CHROMIUM`` if set, else the first on PATH."""
    given = os.environ.get("BAYESAVG_CHROMIUM")
    if given:
        return given if Path(given).exists() or shutil.which(given) else None
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def instrument(page: str) -> str:
    """The page with the error collector first in <head> and the image check at the end."""
    head = re.search(r"<head[^>]*>", page, re.IGNORECASE)
    at = head.end() if head else 0
    page = page[:at] + _EARLY + page[at:]
    end = page.lower().rfind("</body>")
    return page[:end] + _LATE + page[end:] if end >= 0 else page + _LATE


def _verdict(dom: str) -> dict | None:
    found = re.search(rf'<pre id="{_MARKER}">(.*?)</pre>', dom, re.DOTALL)
    if found is None:
        return None
    text = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    return json.loads(text.replace("&amp;", "&"))


def problems(html: Path, browser: str, timeout: float = 60.0) -> tuple[list[str], int]:
    """Every problem found (empty: fine) and the number of images on the page."""
    page = html.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(instrument(page), encoding="utf-8")
        cmd = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            f"--user-data-dir={Path(tmp) / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            copy.as_uri(),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    found = []
    for line in done.stderr.splitlines():
        match = _CONSOLE.search(line)
        if match and ("CONSOLE" not in line or "error" in line.lower() or "Uncaught" in line):
            found.append(f"console: {(match.group(1) or match.group(2) or line).strip()}")
    verdict = _verdict(done.stdout)
    if verdict is None:
        return [*found, f"no verdict from the browser (exit {done.returncode})"], 0
    found += [f"error: {e}" for e in verdict["errors"]]
    found += [f"image not loaded: {name}" for name in verdict["broken"]]
    if verdict["images"] == 0:
        found.append("no images on the page")
    return [_short(f) for f in dict.fromkeys(found)], int(verdict["images"])


def _short(problem: str, limit: int = 160) -> str:
    """One readable line: a data URI in a message is cut, not dumped."""
    line = " ".join(problem.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_report.py REPORT.html", file=sys.stderr)
        return 2
    browser = find_browser()
    if browser is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    found, images = problems(Path(argv[0]), browser)
    for problem in found:
        print(problem)
    if found:
        return 1
    print(f"OK: {argv[0]}: {images} images, 0 console errors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
