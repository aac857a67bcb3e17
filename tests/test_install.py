"""Installing where the GPU is: the torch version check (set-up and stages), `TORCH=system`
in the Makefile, and the offline wheelhouse's choice of what to ship (scripts/wheelhouse.py).
No network: pip's resolution is replaced by small graphs written here."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement

from bayesavg.runtime import torch_version as tv

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wheelhouse = _script("wheelhouse")
check_torch = _script("check_torch")


def _pyproject(name: str) -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(Requirement(d) for d in deps if Requirement(d).name == name)


def _pins() -> dict[str, str]:
    lines = (
        ln.split("#")[0].strip() for ln in (ROOT / "requirements/pins.txt").read_text().splitlines()
    )
    return {check_torch.canonical(ln.split("==")[0]): ln.split("==")[1] for ln in lines if ln}


# --- the torch version check ---------------------------------------------------------


@pytest.mark.parametrize("name", ["torch", "torchvision"])
def test_pyproject_pins_and_the_check_state_one_range(name: str) -> None:
    spec = _pyproject(name).specifier
    oldest, newest = tv.OLDEST[name], tv.NEWEST[name]
    assert _pins()[name] == newest, "the default set-up installs the newest supported"
    for ok in (f"{oldest}.0", f"{oldest}.0+cu130", f"{oldest}.0a0+gitabc.nv25.1", newest):
        assert spec.contains(ok, prereleases=True), ok
        assert tv.problem({**tv.OLDEST, name: ok}, newest=True) is None, ok
    major, minor = (int(p) for p in oldest.split("."))
    before = f"{major}.{minor - 1}.9"
    assert not spec.contains(before, prereleases=True)
    assert not spec.contains(re.sub(r"\d+$", lambda m: str(int(m[0]) + 1), newest))


def test_an_older_torch_is_one_line_naming_what_was_found_and_what_is_needed() -> None:
    found = tv.problem({"torch": "2.10.0+cu126", "torchvision": "0.26.0"})
    assert found is not None and "\n" not in found
    assert "torch 2.10.0+cu126 is older" in found and "torch 2.11" in found
    assert "default set-up" in found
    older_vision = tv.problem({"torch": "2.11.0", "torchvision": "0.25.0"})
    assert older_vision is not None and older_vision.startswith("torchvision 0.25.0")
    missing = tv.problem({"torch": "2.11.0", "torchvision": None})
    assert missing is not None and missing.startswith("torchvision not found")


@pytest.mark.parametrize(
    ("torch", "vision"),
    [
        ("2.11.0+cu130", "0.26.0"),
        ("2.11", "0.26.0+cu130"),
        ("2.11.0a0+git5f3e", "0.26.0a0"),
        ("2.14.1+cu130", "0.29.1"),
        ("3.0.0", "1.0.0"),
    ],
)
def test_the_oldest_supported_or_newer_passes(torch: str, vision: str) -> None:
    assert tv.problem({"torch": torch, "torchvision": vision}) is None
    assert tv.release("2.11.0+cu130") == (2, 11, 0)
    assert not tv.older("2.11", "2.11.0") and tv.older("2.10.99", "2.11")


def test_the_set_up_also_refuses_a_torch_newer_than_the_pinned() -> None:
    found = {"torch": "2.15.0", "torchvision": "0.29.1"}
    assert tv.problem(found) is None, "the stages run on it"
    newer = tv.problem(found, newest=True)
    assert newer is not None and "newer than the newest" in newer and "2.14.1" in newer
    assert tv.problem({"torch": "2.14.1+cu130", "torchvision": "0.29.1"}, newest=True) is None


def _fake(root: Path, name: str, version: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("raise ImportError('never imported')\n")
    (root / name / "version.py").write_text(f"__version__ = '{version}'\ncuda = None\n")


def test_a_stage_refuses_an_older_torch_in_one_line_without_importing_it(tmp_path: Path) -> None:
    _fake(tmp_path, "torch", "2.10.0+cu126")
    _fake(tmp_path, "torchvision", "0.25.0")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "stages")])}
    done = subprocess.run(
        [sys.executable, "-c", "import _bootstrap"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "torch 2.10.0+cu126 is older" in done.stderr


def test_check_torch_exits_2_with_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setattr(check_torch, "outside_venv", lambda venv: {"torch": "2.9.1"})
    assert check_torch.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torchvision not found" not in err
    assert "torch 2.9.1 is older" in err


def test_check_torch_keeps_the_systems_versions_and_pins_only_what_it_lacks(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    system = {"torch": "2.11.0+cu130", "torchvision": "0.26.0", "numpy": "2.5.2", "pyyaml": "6"}
    monkeypatch.setattr(check_torch, "outside_venv", lambda venv: system)
    out = tmp_path / "constraints.txt"
    assert check_torch.main(["--constraints", str(out)]) == 0
    lines = [ln for ln in out.read_text().splitlines() if not ln.startswith("#")]
    assert lines[:2] == ["torch==2.11.0+cu130", "torchvision==0.26.0"]
    assert not any(ln.startswith(("numpy", "pyyaml", "PyYAML")) for ln in lines)
    assert "dvc==3.67.1" in lines
    assert "torch 2.11.0+cu130" in capsys.readouterr().out


def test_a_venv_made_from_a_venvs_python_sees_that_venvs_torch(tmp_path: Path) -> None:
    """/opt/torch/.venv/bin/python3 -m venv --system-site-packages sees only the base
    interpreter's packages: create() links the venv's own (this test runs in one)."""
    import torch.version

    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests run in no venv")
    linked = check_torch.create(tmp_path / "v", pip=False)
    assert linked and (Path(sys.prefix) / "lib") in Path(linked[-1]).parents
    assert "include-system-site-packages = true" in (tmp_path / "v/pyvenv.cfg").read_text()
    where = subprocess.run(
        [tmp_path / "v/bin/python", "-c", "import torch.version as v; print(v.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # the torch this test runs on: the venv's own, or with TORCH=system (the GPU image)
    # the one of the interpreter the venv was made from
    assert Path(where.strip()).resolve() == Path(torch.version.__file__).resolve(), where


# --- the Makefile ---------------------------------------------------------------------


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_system_mode_sees_the_system_site_packages_and_never_asks_for_torch(
    tmp_path: Path,
) -> None:
    venv = tmp_path / ".venv"
    system = _make("-n", "TORCH=system", f"VENV={venv}", "install").stdout
    assert f"scripts/check_torch.py --create {venv}" in system
    assert f"scripts/check_torch.py --constraints {venv}/constraints.txt" in system
    pips = [ln for ln in system.splitlines() if "pip install" in ln]
    assert pips and not any(re.search(r"\btorch(vision)?\s*[=<>~]|pins\.txt", ln) for ln in pips)
    assert "-e '.[dev]'" in system
    pinned = _make("-n", f"VENV={venv}", "install").stdout
    assert f"-m venv {venv}" in pinned and "check_torch" not in pinned
    assert "-c requirements/pins.txt" in pinned
    house = tmp_path / "house"
    house.mkdir()
    (house / "extras.txt").write_text("\n")
    offline = _make("-n", "TORCH=system", f"VENV={venv}", f"WHEELHOUSE={house}", "install")
    pips = [ln for ln in offline.stdout.splitlines() if "pip install" in ln]
    assert pips and all(f"--no-index --find-links {house}" in ln for ln in pips)
    assert "-e '.'" in offline.stdout, "the extras the wheelhouse holds: none"


def test_a_venv_of_the_other_mode_is_an_error_not_a_silent_rebuild(tmp_path: Path) -> None:
    venv = tmp_path / ".venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    done = _make("TORCH=system", f"VENV={venv}", "install")
    assert done.returncode == 2
    assert "set up with TORCH=pinned, not system" in done.stderr
    (venv / "pyvenv.cfg").write_text("include-system-site-packages = true\n")
    assert "check_torch.py" in _make("-n", f"VENV={venv}", "install").stdout, "kept mode"


# --- the wheelhouse ---------------------------------------------------------------------


def test_freeze_names_are_normalised_and_unversioned_lines_skipped() -> None:
    text = (
        "PyYAML==6.0.3\nruamel.yaml.clib==0.2.15\n# comment\n-e git+https://x/y\nfoo @ file:///f\n"
    )
    found, skipped = wheelhouse.read_freeze(text + "Jinja2 == 3.1.6\n")
    assert found == {"pyyaml": "6.0.3", "ruamel-yaml-clib": "0.2.15", "jinja2": "3.1.6"}
    assert skipped == ["foo @ file:///f"]
    assert wheelhouse.canonical("ruamel_yaml.Clib") == "ruamel-yaml-clib"


def _item(name: str, version: str, *requires: str) -> dict[str, object]:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


ITEMS = {
    wheelhouse.canonical(i["metadata"]["name"]): i  # type: ignore[index]
    for i in [
        _item("dvc", "3.67.1", "ruamel.yaml>=0.17", "numpy>=2.0", "rich[jupyter]", "networkx"),
        _item("ruamel.yaml", "0.19.1", "ruamel.yaml.clib>=0.2.7; python_version < '3.14'"),
        _item("ruamel.yaml.clib", "0.2.15"),
        _item(
            "rich",
            "15.0.0",
            "pygments",
            "ipywidgets; extra == 'jupyter'",
            "colorama; sys_platform == 'win32'",
        ),
        _item("pygments", "2.21.0"),
        _item("ipywidgets", "8.1.0"),
        _item("colorama", "0.4.6"),
        _item("numpy", "2.4.6"),
        _item("networkx", "3.6.1"),
        _item("pandas", "3.1.1", "python-dateutil", "numpy"),
        _item("python-dateutil", "2.9.0"),
        _item("PyYAML", "6.0.3"),
    ]
}
ENV = wheelhouse.marker_env("3.12", "manylinux_2_28_x86_64")


def test_what_the_target_has_and_satisfies_stays_out_with_what_only_it_requires() -> None:
    present = {"pyyaml": "6.0.3", "pandas": "2.3.0", "networkx": "3.4", "torch": "2.11.0"}
    roots = ["dvc>=3.67.1,<4", "PyYAML>=6.0", "pandas>=2.0", "torch>=2.11.0a0"]
    ship, left_out = wheelhouse.closure(ITEMS, roots, ENV, present)
    assert ship == [
        "dvc",
        "ipywidgets",
        "numpy",
        "pygments",
        "rich",
        "ruamel-yaml",
        "ruamel-yaml-clib",
    ]
    assert set(left_out) == {"pyyaml", "pandas", "networkx", "torch"}
    assert "python-dateutil" not in ship, "only the target's pandas requires it"
    assert "colorama" not in ship, "windows only"


def test_a_target_version_that_does_not_meet_a_requirement_is_shipped_and_said(capsys) -> None:
    present = {"numpy": "1.26.4", "pyyaml": "5.4", "ruamel-yaml-clib": "0.2.15"}
    ship, left_out = wheelhouse.closure(ITEMS, ["dvc", "pyyaml>=6.0"], ENV, present)
    assert "numpy" in ship and "pyyaml" in ship and "ruamel-yaml-clib" not in ship
    assert left_out == {"ruamel-yaml-clib": "the target's 0.2.15"}
    err = capsys.readouterr().err
    assert "shipping numpy: the target's 1.26.4 does not meet >=2.0" in err
    with pytest.raises(wheelhouse.Failure, match=re.escape("torch 2.9.0 does not meet >=2.11")):
        wheelhouse.closure(ITEMS, ["torch>=2.11.0a0"], ENV, {"torch": "2.9.0"})


def test_satisfied_accepts_local_and_pre_release_versions_as_pip_does_when_installed() -> None:
    assert wheelhouse.satisfied("2.11.0+cu130", [">=2.11.0a0,<=2.14.1"])
    assert wheelhouse.satisfied("2.11.0a0+git", [">=2.11.0a0", ""])
    assert not wheelhouse.satisfied("2.10.1", [">=2.11.0a0"])


def test_target_platform_tags_include_older_manylinux_and_markers_follow_them() -> None:
    tags = wheelhouse.platforms(["manylinux_2_28_x86_64"])
    assert tags[0] == "manylinux_2_28_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert ENV["platform_machine"] == "x86_64" and ENV["python_version"] == "3.12"
    assert ENV["sys_platform"] == "linux"


def test_the_makefiles_no_deps_installs_are_in_the_wheelhouse() -> None:
    found = wheelhouse.no_deps_requirements()
    assert {r.split("==")[0] for r in found} >= {"mlxtend", "animal-mnist", "swa-gaussian"}


def test_a_stub_wheel_names_its_version_and_requires_nothing(tmp_path: Path) -> None:
    import zipfile

    wheelhouse.stub_wheel(tmp_path, "ruamel.yaml.clib", "0.2.15+wheelhouse")
    (whl,) = tmp_path.glob("*.whl")
    assert whl.name == "ruamel_yaml_clib-0.2.15+wheelhouse-py3-none-any.whl"
    with zipfile.ZipFile(whl) as z:
        meta = z.read("ruamel_yaml_clib-0.2.15+wheelhouse.dist-info/METADATA").decode()
    assert "Version: 0.2.15+wheelhouse" in meta and "Requires-Dist" not in meta
