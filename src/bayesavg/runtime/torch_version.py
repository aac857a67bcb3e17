"""The torch and torchvision releases the code supports, and the check of what is importable.

The oldest are those of the GPU images users run today; the newest is the pinned set-up's
(``requirements/pins.txt``), and ``pyproject.toml`` states the same range. The check reads
each package's own ``version.py`` instead of importing it or asking ``importlib.metadata``
(about 0.2 s, more than a stage can spare), so the stages' bootstrap refuses an older torch
in one line before anything imports it; ``scripts/check_torch.py`` refuses it the same way
before ``make install TORCH=system`` runs pip.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path

OLDEST = {"torch": "2.11", "torchvision": "0.26"}
NEWEST = {"torch": "2.14.1", "torchvision": "0.29.1"}
FIX = "use the default set-up (`make install` without TORCH=system: torch 2.14.1 in .venv)"


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version: ``2.11.0+cu130`` and ``2.11.0a0+git5f3e`` (an NGC
    build of 2.11) give (2, 11, 0). Raises ValueError if it starts with no number."""
    found = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if found is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in found.group(1).split("."))


def _key(version: str) -> tuple[int, ...]:
    numbers = release(version)
    return numbers + (0,) * (3 - len(numbers))


def older(version: str, than: str) -> bool:
    """Whether ``version``'s release is before ``than``'s (``2.11`` == ``2.11.0``)."""
    return _key(version) < _key(than)


def importable_version(name: str) -> str | None:
    """``name.__version__`` as its ``version.py`` states it, without importing the package;
    None if it cannot be imported or states no version."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "version.py"
        if path.is_file():
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", path.read_text(), re.M)
            return found.group(1) if found else None
    return None


def problem(found: Mapping[str, str | None], newest: bool = False) -> str | None:
    """One line saying what is wrong with the ``found`` versions of torch and torchvision
    (None: not found), or None if both are supported. ``newest``: also refuse a release
    newer than the newest tested (pip would refuse it against pyproject's range)."""
    needed = f"torch {OLDEST['torch']} with torchvision {OLDEST['torchvision']} or newer"
    for name in ("torch", "torchvision"):
        version = found.get(name)
        if version is None:
            return f"{name} not found: bayesavg needs {needed}; install it, or {FIX}"
        try:
            too_old = older(version, OLDEST[name])
        except ValueError:
            return f"{name} has version {version!r}, which is not a release number; {FIX}"
        if too_old:
            return (
                f"{name} {version} is older than the oldest bayesavg supports ({needed}); "
                f"upgrade it, or {FIX}"
            )
        if newest and older(NEWEST[name], version):
            return (
                f"{name} {version} is newer than the newest bayesavg is tested with "
                f"({name} {NEWEST[name]}); {FIX}"
            )
    return None


def check_importable() -> str | None:
    """``problem`` for the torch and torchvision this interpreter would import."""
    return problem({name: importable_version(name) for name in OLDEST})
