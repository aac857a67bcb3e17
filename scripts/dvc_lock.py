"""``dvc`` that rewrites only the finished stage's entry of ``dvc.lock``: what
``scripts/repro.py`` runs for each stage (``python scripts/dvc_lock.py repro ...``).

Why: after every stage DVC rewrites ``dvc.lock`` through ``modify_yaml``, which parses
the whole file with ruamel's round-trip loader (pure Python, to keep comments and
styles) and dumps all of it again. This pipeline's lock holds 45 entries and 1,600
files (261 kB): 1.5 s to parse and 0.9 s to dump on this project's 2-core machine,
two thirds of the 3.7 s a stage pays DVC, and DVC holds the repository lock meanwhile,
so the stage running beside waits too. A lock is written by DVC alone, so the
round trip keeps nothing: here it is read with ruamel's safe loader (libyaml, 0.26 s)
and only the entries that changed are dumped, with DVC's own dumper, in place of
theirs. DVC's YAML writes a mapping as its entries one after another, so that is the
text DVC writes, byte for byte (tests/test_dvc_lock.py checks entries at five
positions of the committed lock, new ones and a real DVC run). The result is read
back and must equal what DVC would have written, else DVC's own full dump writes it.
Any other file, or a lock whose top level changed, goes through DVC's
``modify_yaml`` as before.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

LOCK = "dvc.lock"
STAGE_INDENT = "  "  # a stage's key under ``stages:`` in DVC's dump


def _load(text: str) -> Any:
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(text) or {}


def _dump(data: Any) -> str:
    """``data`` as DVC's ``dump_yaml`` writes it (its ruamel settings)."""
    from dvc.utils.serialize._yaml import _dump

    stream = io.StringIO()
    _dump(data, stream)
    return stream.getvalue()


def _stages_span(lines: list[str]) -> tuple[int, int] | None:
    """The lines of the ``stages:`` mapping's entries: [start, end)."""
    try:
        start = lines.index("stages:\n") + 1
    except ValueError:
        return None
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith(" ")), len(lines))
    return start, end


def _entry(lines: list[str], key_line: str, span: tuple[int, int]) -> tuple[int, int] | None:
    """The lines of the stage entry that starts with ``key_line``: [start, end)."""
    start, end = span
    for i in range(start, end):
        if lines[i] == key_line:
            stop = i + 1
            while stop < end and not _starts_entry(lines[stop]):
                stop += 1
            return i, stop
    return None


def _starts_entry(line: str) -> bool:
    return line.startswith(STAGE_INDENT) and not line.startswith(STAGE_INDENT + " ")


def splice(text: str, data: dict[str, Any], before: dict[str, Any]) -> str:
    """The lock ``text`` (whose stages were ``before``) with the entries of ``data``'s
    stages that are not the objects ``before`` held dumped in place of theirs (or after
    the others, for new stages): DVC's full dump of ``data``, or that dump itself where
    a stage was removed or anything else changed."""
    stages = data.get("stages")
    old = list(before)
    if not isinstance(stages, dict) or list(stages)[: len(old)] != old:
        return _dump(data)
    lines = text.splitlines(keepends=True)
    span = _stages_span(lines)
    if span is None or not text.endswith("\n"):
        return _dump(data)
    for name, value in stages.items():
        if before.get(name) is value:
            continue
        chunk = _dump({"stages": {name: value}}).splitlines(keepends=True)
        if chunk[0] != "stages:\n" or not _starts_entry(chunk[1]):
            return _dump(data)
        body = chunk[1:]
        found = _entry(lines, body[0], span) if name in before else None
        if name in before and found is None:
            return _dump(data)
        at, stop = found if found is not None else (span[1], span[1])
        lines[at:stop] = body
        span = (span[0], span[1] + len(body) - (stop - at))
    out = "".join(lines)
    return out if _load(out) == data else _dump(data)


@contextlib.contextmanager
def modify_lock(path: Any, fs: Any = None) -> Iterator[Any]:
    """DVC's ``modify_yaml`` for ``dvc.lock`` on the local file system, writing only the
    entries that changed (``splice``); any other file: DVC's own."""
    from dvc.utils.serialize import modify_yaml
    from dvc_objects.fs.local import LocalFileSystem

    local = fs is None or isinstance(fs, LocalFileSystem)
    if os.path.basename(os.fspath(path)) != LOCK or not local or not os.path.exists(path):
        with modify_yaml(path, fs=fs) as data:
            yield data
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    data = _load(text)
    top = {k: v for k, v in data.items() if k != "stages"}
    before = dict(data.get("stages") or {})
    yield data
    unchanged_top = {k: v for k, v in data.items() if k != "stages"} == top
    out = splice(text, data, before) if unchanged_top and before else _dump(data)
    if out != text:
        fresh = f"{path}.{os.getpid()}.tmp"
        try:
            with open(fresh, "w", encoding="utf-8") as f:
                f.write(out)
            os.replace(fresh, path)  # readers see the old lock or the new, never half
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(fresh)


def install() -> bool:
    """DVC's lock writes (``dvc.dvcfile``'s ``modify_yaml``) through ``modify_lock``, where
    this DVC has the internals it relies on (else DVC's own writer: the same bytes)."""
    import dvc.dvcfile
    import dvc.utils.serialize._yaml as dvc_yaml

    if not hasattr(dvc.dvcfile, "modify_yaml") or not hasattr(dvc_yaml, "_dump"):
        return False
    dvc.dvcfile.modify_yaml = modify_lock  # type: ignore[assignment]
    return True


ORPHAN_POLL_S = 0.5  # how often a stage's dvc looks whether its parent is still there


def stop_with_parent() -> None:
    """Stop this ``dvc`` and its stage when the process that started it dies.

    ``scripts/repro.py`` runs each stage in a session of its own (a signal it gets is
    passed on once), so a SIGKILL of repro.py's process group (a time box, a
    supervisor) would not reach the stage, which would go on as an orphan. A thread
    watches the parent; once this process is orphaned it sends SIGTERM to its own
    process group, the stage's tree and itself, which stop as on any SIGTERM. (Not
    Linux's parent-death signal: it fires when the parent's *thread* ends, and
    repro.py starts stages from threads.)
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_POLL_S)
        os.killpg(0, signal.SIGTERM)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="stop-with-parent", daemon=True).start()


if __name__ == "__main__":
    stop_with_parent()
    install()
    from dvc.cli import main

    sys.exit(main(sys.argv[1:]))
