"""``make install TORCH=system``: check an interpreter's torch and torchvision before pip runs,
give ``.venv`` that interpreter's packages, and write the constraints pip installs with.

A GPU image, an NGC-style container or a cluster node usually has a CUDA PyTorch that
works; ``.venv`` then sees it instead of downloading its own. Exits 2 with one line when
torch or torchvision is missing, older than the oldest supported or newer than the newest
tested (``bayesavg.runtime.torch_version``).

``--create VENV``, run by the interpreter whose torch is used (the Makefile's ``PYTHON``):
creates VENV with ``--system-site-packages`` and, where that interpreter is itself a venv
(``/opt/torch/.venv/bin/python3``; a venv made from a venv sees only the base
interpreter's packages) or has a user site, a ``.pth`` that adds its site-packages after
VENV's own. ``--constraints FILE``, run by VENV's python: torch and torchvision at the
versions found, so pip keeps them (it can neither replace nor download them), and the pins
of ``requirements/pins.txt`` for every distribution the interpreter does not already have:
what it has stays as it is (a venv shadowing the system's numpy with another one can break
the system's compiled packages).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bayesavg.runtime.torch_version import OLDEST, problem  # noqa: E402

PINS = ROOT / "requirements" / "pins.txt"
LINK = "_bayesavg_system_site.pth"


def canonical(name: str) -> str:
    """PEP 503 name: ``PyYAML`` -> ``pyyaml``, ``ruamel.yaml.clib`` -> ``ruamel-yaml-clib``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def outside_venv(venv: Path | None) -> dict[str, str]:
    """Canonical name -> version of each distribution this interpreter sees outside
    ``venv`` (None: all of them)."""
    prefix = venv.resolve() if venv is not None else None
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        where = Path(str(dist.locate_file(""))).resolve()
        if name and prefix not in (where, *where.parents):
            found.setdefault(canonical(name), dist.version)
    return found


def constraints(pins: list[str], system: dict[str, str]) -> list[str]:
    """torch and torchvision at the system's versions, then each pin the system lacks."""
    lines = [f"{name}=={system[name]}" for name in OLDEST]
    for line in pins:
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if name and canonical(name.group(1)) not in system:
            lines.append(line.strip())
    return lines


def site_dirs() -> list[str]:
    """This interpreter's site directories that a venv made from it would not see: its own
    venv's site-packages, its user site."""
    own = set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        own.add(site.getusersitepackages())
    base = set(site.getsitepackages([sys.base_prefix]))
    return [p for p in sys.path if p in own and p not in base]


def create(venv: Path, pip: bool = True) -> list[str]:
    """Make ``venv`` see this interpreter's packages; returns the directories linked."""
    command = [sys.executable, "-m", "venv", "--system-site-packages", str(venv)]
    subprocess.run(command if pip else [*command, "--without-pip"], check=True)
    dirs = site_dirs()
    if dirs:
        purelib = Path(sysconfig.get_path("purelib", vars={"base": venv, "platbase": venv}))
        lines = [f"import site; site.addsitedir({d!r})\n" for d in dirs]
        (purelib / LINK).write_text(f"# {sys.executable}'s packages (check_torch.py)\n", "utf-8")
        with (purelib / LINK).open("a", encoding="utf-8") as f:
            f.writelines(lines)
    return dirs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--create", type=Path, metavar="VENV", help="create this venv")
    parser.add_argument("--constraints", type=Path, help="write pip's constraints here")
    args = parser.parse_args(argv)
    # --create: run by the interpreter whose packages .venv will see, all of them
    system = outside_venv(None if args.create else Path(sys.prefix))
    found = problem({name: system.get(name) for name in OLDEST}, newest=True)
    if found is not None:
        other = "; PYTHON=/path/to/python3 picks another interpreter" if args.create else ""
        print(f"error: {sys.executable}: {found}{other}", file=sys.stderr)
        return 2
    versions = ", ".join(f"{name} {system[name]}" for name in OLDEST)
    if args.create is not None:
        linked = create(args.create)
        print(f"{args.create}: {sys.executable}'s {versions}" + " (linked)" * bool(linked))
    if args.constraints is not None:
        lines = (line.split("#")[0] for line in PINS.read_text().splitlines())
        text = "\n".join(constraints([ln for ln in lines if ln.strip()], system))
        args.constraints.write_text(f"# written by scripts/check_torch.py\n{text}\n")
        print(f"{args.constraints}: pip keeps {versions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
