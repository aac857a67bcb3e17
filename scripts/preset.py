"""Write params.yaml from a preset in presets/ (the papers' protocols), optionally with
overrides: ``python scripts/preset.py cifar10 [--set key=value ...] [--out FILE]``.

A preset is a complete params file, or ``base: <preset>`` plus ``set:`` (dotted keys,
as ``dvc exp run -S`` takes them). The result is validated as every stage validates
params.yaml before it is written: a bad preset or override is one line and exit 2, and
the old params.yaml stays. A preset applied as it is keeps its comments.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "presets"
sys.path.insert(0, str(ROOT / "src"))

from bayesavg.config import parse_params  # noqa: E402
from bayesavg.runtime.errors import UserError  # noqa: E402


def names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def _read(name: str) -> tuple[dict[str, Any], str]:
    path = PRESETS / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"no preset {name!r}; choose one of {', '.join(names())}")
    text = path.read_text(encoding="utf-8")
    return yaml.safe_load(text), text


def set_key(params: dict[str, Any], key: str, value: Any) -> None:
    """``params[a][b][c] = value`` for key ``a.b.c``; every part but the last must exist."""
    *path, last = key.split(".")
    node = params
    for part in path:
        if not isinstance(node, dict) or part not in node:
            raise UserError(f"--set {key}: no section {part!r} in the preset")
        node = node[part]
    if not isinstance(node, dict):
        raise UserError(f"--set {key}: {'.'.join(path)} is not a section")
    node[last] = value


def resolve(name: str, overrides: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The preset's params with its base and ``overrides`` applied, and its own text when
    nothing was changed (to keep its comments)."""
    raw, text = _read(name)
    changes = dict(overrides)
    if "base" in raw:
        changes = {**(raw.get("set") or {}), **changes}
        raw, _ = resolve(raw["base"], {})
    for key, value in changes.items():
        set_key(raw, key, value)
    return raw, (text if not changes else None)


def write(name: str, overrides: dict[str, Any], out: Path) -> None:
    params, text = resolve(name, overrides)
    try:
        parse_params(params)
    except UserError as err:  # its line names params.yaml: say what is being written
        said = str(err).removeprefix("params.yaml: ")
        raise UserError(f"{out.name} from presets/{name}.yaml: {said}") from err
    if text is None:
        header = f"# Written by scripts/preset.py from presets/{name}.yaml"
        if overrides:
            header += " with " + ", ".join(f"{k}={v!r}" for k, v in overrides.items())
        text = header + "\n" + yaml.safe_dump(params, sort_keys=False, width=100)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, out)


def _override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, yaml.safe_load(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", help=f"one of: {', '.join(names())}")
    parser.add_argument("--set", dest="overrides", type=_override, action="append", default=[])
    parser.add_argument("--out", type=Path, default=ROOT / "params.yaml")
    args = parser.parse_args(argv)
    try:
        write(args.preset, dict(args.overrides), args.out)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{args.out.name}: preset {args.preset}" + (" with overrides" if args.overrides else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
