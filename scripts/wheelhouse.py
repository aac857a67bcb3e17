"""Write an offline wheelhouse: the wheels of everything bayesavg needs except PyTorch, for
another machine's Python and platform.

Why: a GPU machine (a cloud deep-learning image, an NGC-style container, a cluster node)
usually has a working CUDA PyTorch and often no network. There, ``make install
TORCH=system WHEELHOUSE=dir`` keeps its torch and installs the rest from this folder with
``pip install --no-index``, which needs no network.

In: the project's requirements, transitively, with the extras asked for (``--extras dev``
for ``make test``), at the versions of ``requirements/pins.txt``; the distributions the
Makefile installs with ``--no-deps`` (found there); setuptools, to build the editable
install (the project itself is installed from its checkout, not from a wheel).
Out: torch, torchvision and whatever only they require (the target has them working), and
each distribution of the target's ``pip freeze`` (``--exclude-freeze``) whose version
satisfies every requirement on it, with whatever only it requires; one that does not is
shipped and named. A distribution with no wheel for the target (an sdist only) is built
into a wheel here and must be pure Python. Last, pip resolves the project for the target
from the folder alone (``--no-index``), the freeze's distributions standing in as empty
stubs: the folder is complete. Usage (the Makefile's ``wheelhouse`` target)::

    python scripts/wheelhouse.py --python-version 3.12 --platform manylinux_2_28_x86_64 \\
        --exclude-freeze target-freeze.txt --out wheelhouse
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
except ImportError:  # any interpreter with pip runs this
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "requirements" / "pins.txt"
TARGET_HAS = ("torch", "torchvision")  # always the target's own
STUB = "wheelhouse"  # local version label of the stand-ins for torch while resolving


class Failure(Exception):
    """One line for the user; exit 1."""


def canonical(name: str) -> str:
    """PEP 503: ``PyYAML`` -> ``pyyaml``, ``ruamel.yaml.clib`` -> ``ruamel-yaml-clib``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_freeze(text: str) -> tuple[dict[str, str], list[str]]:
    """``pip freeze`` output -> (canonical name -> version, lines with no version)."""
    found: dict[str, str] = {}
    skipped = []
    for raw in text.splitlines():
        line = raw.split("#")[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*===?\s*(\S+)", line)
        if match:
            found[canonical(match.group(1))] = match.group(2)
        else:
            skipped.append(line)
    return found, skipped


def satisfied(version: str, specs: Iterable[str]) -> bool:
    """Whether an installed ``version`` meets every specifier (pip accepts an installed
    pre-release: so does this)."""
    return all(SpecifierSet(s).contains(version, prereleases=True) for s in specs)


def project(extras: list[str]) -> tuple[list[str], list[str]]:
    """(the project's requirements with ``extras``, its build requirements)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(meta["project"]["dependencies"])
    for extra in extras:
        reqs += meta["project"]["optional-dependencies"][extra]
    return reqs, list(meta["build-system"]["requires"])


def no_deps_requirements() -> list[str]:
    """What the Makefile installs with ``--no-deps`` (mlxtend, animal-mnist, swa-gaussian)."""
    lines = (line for line in (ROOT / "Makefile").read_text().splitlines() if "--no-deps" in line)
    return [req for line in lines for req in re.findall(r"[A-Za-z0-9._-]+==[^\s'\"]+", line)]


def platforms(tags: list[str]) -> list[str]:
    """Each ``manylinux_2_N_arch`` with every older glibc's tags (pip takes only the exact
    tag given), legacy aliases included."""
    out: list[str] = []
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    for tag in tags:
        match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
        if not match:
            out.append(tag)
            continue
        arch = match.group(2)
        for minor in range(int(match.group(1)), 4, -1):
            out.append(f"manylinux_2_{minor}_{arch}")
            if minor in legacy:
                out.append(f"{legacy[minor]}_{arch}")
    return list(dict.fromkeys(out))


def marker_env(python_version: str, platform: str) -> dict[str, str]:
    """The environment markers of a CPython ``python_version`` on ``platform``."""
    system = (
        ("darwin", "Darwin")
        if platform.startswith("macosx")
        else ("win32", "Windows")
        if platform.startswith("win")
        else ("linux", "Linux")
    )
    machine = re.sub(
        r"^(many|musl)linux_\d+_\d+_|^manylinux\d+_|^macosx_\d+_\d+_|^win_", "", platform
    )
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "implementation_version": f"{python_version}.0",
        "platform_python_implementation": "CPython",
        "os_name": "nt" if system[0] == "win32" else "posix",
        "sys_platform": system[0],
        "platform_system": system[1],
        "platform_machine": {"amd64": "AMD64"}.get(machine, machine),
        "platform_release": "",
        "platform_version": "",
    }


def stub_wheel(folder: Path, name: str, version: str) -> None:
    """An empty wheel of ``name`` ``version`` that requires nothing: a stand-in."""
    dist = f"{canonical(name).replace('-', '_')}-{version}"
    files = {
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: stub\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{f},,\n" for f in [*files, "RECORD"])
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)


# pip takes --platform and --python-version only with --target, even for a dry run
DRY_RUN = ("install", "--quiet", "--dry-run", "--ignore-installed", "--target", "/nonexistent")
DOWNLOAD = ("download", "--quiet", "--no-deps")


def pip(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *map(str, args)],
        capture_output=True,
        text=True,
    )


def build(req: str, built: Path) -> str:
    """Build ``req`` (an sdist-only distribution) into a wheel in ``built``; it must be
    pure Python, since it is built for this interpreter, not the target's."""
    before = set(built.iterdir())
    done = pip("wheel", "--quiet", "--no-deps", "--wheel-dir", built, req)
    new = [p.name for p in set(built.iterdir()) - before]
    if done.returncode != 0 or len(new) != 1:
        raise Failure(
            f"{req} has no wheel for the target and could not be built here: "
            f"{done.stderr.strip().splitlines()[-1:]}"
        )
    if not re.search(r"-py(2\.)?py3-none-any\.whl$|-py3-none-any\.whl$", new[0]):
        (built / new[0]).unlink()
        raise Failure(
            f"{req} has no wheel for the target, and built here it is not pure "
            f"Python ({new[0]}): the target must build it itself"
        )
    return new[0]


def dry_run(*args: str | Path) -> list[dict[str, Any]]:
    """What ``pip install`` would install: its report's items."""
    with tempfile.TemporaryDirectory() as tmp:
        done = pip(*DRY_RUN, "--report", Path(tmp) / "r.json", *args)
        if done.returncode != 0:
            raise Failure("pip cannot resolve the project for the target:\n" + done.stderr)
        return list(json.loads((Path(tmp) / "r.json").read_text())["install"])


def resolve(
    target: list[str], reqs: Path, constraints: list[str], free: Iterable[str], work: Path
) -> list[dict[str, Any]]:
    """pip's resolution for the target: the report's items. First for this interpreter,
    which may take sdists: those are built into wheels in ``built``, and the versions it
    finds constrain the target's resolution (the releases of the default set-up; without
    them pip backtracks through every release of a distribution that has only an sdist),
    except those in ``free`` (what the target has)."""
    built = work / "built"
    finds = [f"--find-links={work / 'stubs'}", f"--find-links={built}"]
    here = write_lines(work / "here.txt", constraints)
    versions = []
    for item in dry_run("-c", here, "-r", reqs, *finds):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if not item["download_info"]["url"].endswith(".whl"):
            print(f"building {name} {version}: it has only an sdist", file=sys.stderr)
            build(f"{name}=={version}", built)
        if canonical(name) not in free:
            versions.append(f"{name}=={version}")
    there = write_lines(work / "there.txt", constraints + versions)
    return dry_run(*target, "-c", there, "-r", reqs, *finds)


def closure(
    items: Mapping[str, dict[str, Any]],
    roots: list[str],
    env: Mapping[str, str],
    present: Mapping[str, str],
) -> tuple[list[str], dict[str, str]]:
    """(the resolved distributions to ship, names left out -> why), walking from ``roots``.

    A distribution the target has (``present``) is left out, and not walked into, when its
    version meets every requirement on it from what is shipped; else it is shipped too.
    """
    keep = set(present)
    while True:
        ship: dict[str, set[str]] = {}  # name -> extras asked for
        wanted: dict[str, list[str]] = {}  # name -> specifiers on it from what ships
        stack: list[tuple[str, str]] = [(r, "") for r in roots]
        while stack:
            line, extra = stack.pop()
            req = Requirement(line)
            if req.marker and not req.marker.evaluate({**env, "extra": extra}):
                continue
            name = canonical(req.name)
            wanted.setdefault(name, []).append(str(req.specifier))
            if name in keep:
                continue
            if name not in items:
                raise Failure(f"{name} is required but pip's resolution lacks it")
            new = ({""} | set(req.extras)) - ship.get(name, set())
            ship.setdefault(name, set()).update(new)
            for dep in items[name]["metadata"].get("requires_dist", []):
                stack += [(dep, e) for e in new]
        unmet = {n for n in keep & wanted.keys() if not satisfied(present[n], wanted[n])}
        if not unmet:
            break
        for name in unmet & set(TARGET_HAS):
            raise Failure(
                f"the target's {name} {present[name]} does not meet "
                f"{', '.join(s for s in wanted[name] if s)}: see bayesavg.runtime."
                "torch_version"
            )
        for name in sorted(unmet):
            print(
                f"shipping {name}: the target's {present[name]} does not meet "
                f"{', '.join(s for s in wanted[name] if s)}",
                file=sys.stderr,
            )
        keep -= unmet
    why = {
        n: "torch's own" if n in TARGET_HAS else f"the target's {present[n]}"
        for n in sorted(keep & wanted.keys())
    }
    return sorted(ship), why


def write_lines(path: Path, lines: Iterable[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-version", required=True, help="the target's, e.g. 3.12")
    parser.add_argument("--platform", action="append", help="default manylinux_2_28_x86_64")
    parser.add_argument("--exclude-freeze", type=Path, help="the target's `pip freeze`")
    parser.add_argument("--extras", default="", help="e.g. dev (make test); comma-separated")
    parser.add_argument("--out", type=Path, default=ROOT / "wheelhouse")
    args = parser.parse_args(argv)
    try:
        return make(args)
    except Failure as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def make(args: argparse.Namespace) -> int:
    out: Path = args.out.resolve()
    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").exists():
        raise Failure(f"{out} is not empty and holds no wheelhouse: choose another --out")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tags = platforms(args.platform or ["manylinux_2_28_x86_64"])
    target = [
        "--only-binary=:all:",
        "--implementation=cp",
        f"--python-version={args.python_version}",
    ]
    target += [f"--platform={t}" for t in tags]
    env = marker_env(args.python_version, tags[0])
    present, skipped = read_freeze(args.exclude_freeze.read_text() if args.exclude_freeze else "")
    for line in skipped:
        print(f"ignoring freeze line (no version): {line}", file=sys.stderr)
    lines = [line.split("#")[0].strip() for line in PINS.read_text().splitlines()]
    pins = {canonical(Requirement(line).name): line for line in lines if line}
    for name in TARGET_HAS:  # without a freeze: the pinned release stands in
        present.setdefault(name, pins[name].split("==")[1])
    extras = [e for e in args.extras.split(",") if e]
    reqs, build_reqs = project(extras)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for folder in ("stubs", "built", "no-deps", "freeze-stubs"):
            (work / folder).mkdir()
        constraints = [pins[n] for n in pins if n not in present]
        for name in TARGET_HAS:
            version = present[name] + ("." if "+" in present[name] else "+") + STUB
            stub_wheel(work / "stubs", name, version)
            constraints.append(f"{name}=={version}")
        roots = write_lines(work / "roots.txt", reqs + build_reqs)
        resolved = resolve(target, roots, constraints, set(present) - set(TARGET_HAS), work)
        items = {canonical(i["metadata"]["name"]): i for i in resolved}
        ship, left_out = closure(items, reqs, env, present)
        ship = sorted({*ship, *closure(items, build_reqs, env, {})[0]})  # build isolation
        left_out = {n: why for n, why in left_out.items() if n not in ship}
        meta = [items[n]["metadata"] for n in ship]
        shipped = [f"{m['name']}=={m['version']}" for m in meta]
        links = f"--find-links={work / 'built'}"
        done = pip(*DOWNLOAD, "-d", out, *target, links, "-r", write_lines(work / "s.txt", shipped))
        if done.returncode != 0:
            raise Failure("pip could not download the wheels:\n" + done.stderr)
        no_deps = no_deps_requirements()
        for req in no_deps:  # their declared deps are not wanted: no resolution
            if pip(*DOWNLOAD, "-d", work / "no-deps", *target, req).returncode != 0:
                build(req, work / "no-deps")
        for whl in (work / "no-deps").glob("*.whl"):
            shutil.copy(whl, out / whl.name)
        for name in left_out:
            stub_wheel(work / "freeze-stubs", name, present[name])
        has = write_lines(work / "has.txt", (f"{n}=={present[n]}" for n in left_out))
        links = f"--find-links={work / 'freeze-stubs'}"  # the target's, requiring nothing
        done = pip(
            *DRY_RUN, "--no-index", f"--find-links={out}", links, *target, "-c", has, "-r", roots
        )
        if done.returncode != 0:
            raise Failure("the wheelhouse is incomplete: offline, pip says\n" + done.stderr)
    return report(out, args, tags, shipped + no_deps, left_out, extras)


def report(
    out: Path,
    args: argparse.Namespace,
    tags: list[str],
    shipped: list[str],
    left_out: Mapping[str, str],
    extras: list[str],
) -> int:
    """Write manifest.json, requirements.txt and extras.txt (the Makefile reads it); print
    what the folder holds and its size."""
    wheels = sorted(out.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    manifest = {
        "python_version": args.python_version,
        "platforms": tags,
        "freeze": str(args.exclude_freeze) if args.exclude_freeze else None,
        "extras": extras,
        "wheels": {w.name: w.stat().st_size for w in wheels},
        "left_out": dict(left_out),
        "total_bytes": total,
        "install": "make install TORCH=system WHEELHOUSE=<this folder>",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    write_lines(out / "requirements.txt", sorted(shipped, key=str.lower))
    write_lines(out / "extras.txt", [",".join(extras)])
    print(
        f"{out}: {len(wheels)} wheels, {total / 2**20:.1f} MiB, for CPython "
        f"{args.python_version} on {tags[0]}; left out {len(left_out)} the target has"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
