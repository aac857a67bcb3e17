"""A set of output paths replaced all together or not at all.

``io`` writes each file atomically, but a process that writes several units one
after another (an evaluation per predictor, a probe per trajectory) and fails or
is interrupted after the first would leave a partial set, which any reader
would take for a result. ``all_or_nothing`` gives such a process the set's
semantics: the paths' old contents (files or folders) are moved aside first,
the body writes straight to the real paths, and on any exception, including
``KeyboardInterrupt`` and ``SystemExit``, what the body wrote is removed and the
old contents are put back; on success the old contents are dropped.

The files go to their final paths, not to a staging folder renamed into place at
the end, because a path may be handed to another process that reads it later
(the MLflow worker copies an artifact when it gets to the call): a staging path
would be gone by then. The price: while the body runs, a reader sees the new
set growing, as it would without this. The old contents wait beside each path
(``.<name>.<random>.old``) on the same file system, so moving them is a rename.

A SIGKILL leaves no chance to roll back: the old contents stay aside and the paths
hold what the body had written. The next ``all_or_nothing`` over a path finishes
that roll-back first (``finish_killed``, which a caller may also call before, to see
what it puts back), so the old contents are what it then moves aside, and what it puts
back if it fails too.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from .entry import stops_deferred
from .io import TEMP_RANDOM


@contextlib.contextmanager
def all_or_nothing(paths: Iterable[str | os.PathLike[str]]) -> Iterator[None]:
    """Run the body as the only writer of ``paths``: all it wrote stays on success; on
    failure none of it does, and what the paths held before is back in place.

    A path inside another one listed is covered by that one. Folders missing before
    the body ran are removed again on failure when it left them empty. Files other
    than ``paths`` are never touched.
    """
    targets = _outermost(paths)
    moved: list[tuple[Path, Path]] = []  # (path, the folder its old content waits in)
    claimed: list[Path] = []  # the paths whose content from now on is the body's
    created: set[Path] = set()  # missing parent folders, which the body may create
    try:
        for path in targets:
            _finish_killed(path)
            created.update(_missing_parents(path))
            if os.path.lexists(path):
                prefix = f".{path.name}."
                aside = Path(tempfile.mkdtemp(prefix=prefix, suffix=".old", dir=path.parent))
                moved.append((path, aside))
                os.rename(path, aside / path.name)
            claimed.append(path)
        yield
    except BaseException:
        _roll_back(claimed, moved, created)
        raise
    # The set is whole: a stop now waits for the old contents to go. Cut short, they would
    # wait aside, and the next run would take them for a killed set's and put them back.
    with stops_deferred():
        for _, aside in moved:
            _remove(aside)


def finish_killed(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Finish the roll-back of a killed ``all_or_nothing`` over ``paths``, if there was one."""
    for path in _outermost(paths):
        _finish_killed(path)


def _finish_killed(path: Path) -> None:
    """Put back what a killed ``all_or_nothing`` over ``path`` had moved aside, removing
    what its body wrote; asides of killed runs before that one (which held a killed
    body's writes) go. ``mkdtemp`` names them ``.<name>.<random>.old``."""
    pattern = re.compile(re.escape(f".{path.name}.") + TEMP_RANDOM + re.escape(".old"))
    with contextlib.suppress(FileNotFoundError):
        stale = [e for e in os.scandir(path.parent) if pattern.fullmatch(e.name) and e.is_dir()]
        stale.sort(key=lambda e: e.stat().st_mtime_ns)
        restored = False
        for entry in stale:  # the first that holds the path holds what was there first
            kept = Path(entry.path) / path.name
            if not restored and os.path.lexists(kept):
                _remove(path)
                os.rename(kept, path)
                restored = True
            _remove(Path(entry.path))


def _outermost(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """``paths`` made absolute (cwd may change in the body), without the duplicates
    and the ones inside another: moving a folder aside moves what it holds."""
    found = list(dict.fromkeys(Path(os.path.abspath(p)) for p in paths))
    return [p for p in found if not any(q != p and q in p.parents for q in found)]


def _missing_parents(path: Path) -> list[Path]:
    missing = []
    for parent in path.parents:
        if os.path.lexists(parent):
            break
        missing.append(parent)
    return missing


def _roll_back(claimed: list[Path], moved: list[tuple[Path, Path]], created: set[Path]) -> None:
    """Remove what the body wrote, put the old contents back, then the folders it made."""
    for path in claimed:
        _remove(path)
    for path, aside in reversed(moved):
        kept = aside / path.name
        if os.path.lexists(kept):  # else interrupted between making ``aside`` and the move
            os.rename(kept, path)
        _remove(aside)
    for folder in sorted(created, key=lambda f: len(f.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty, or gone: not ours to remove
            folder.rmdir()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
