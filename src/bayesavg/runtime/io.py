"""Atomic output writing and file hashing.

Every output goes through a temp file in the same directory and an
``os.replace``, so a failing stage never leaves a half-written file behind,
and both are fsynced, so a power loss leaves the old file or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import disk_full, no_space, not_writable, refused

_UMASK = os.umask(0)
os.umask(_UMASK)


_TEMP_SUFFIX = ".tmp"
# mkstemp's and mkdtemp's random part: 8 of [a-z0-9_], never a dot, so one file's pattern
# matches no other file's temporaries (".a.pt.b.pt.XXXXXXXX.tmp" is not one of "a.pt"'s)
TEMP_RANDOM = "[a-z0-9_]{8}"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path next to ``path``; rename it onto ``path`` on success.

    The temp file is fsynced before the rename and the directory after it:
    without that, a power loss after the rename can leave ``path`` empty or
    garbled (the rename reaches the disk before the data) instead of old or new.
    A full disk ends as a ``UserError`` naming ``path`` (torch's own report of it
    is "unexpected pos 1487936 vs 1487840"), the temp file removed; so does a folder it
    may not write in (read-only, or another user's).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TEMP_SUFFIX)
    except OSError as err:
        _raise_unwritten(path, err)
        raise
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs are ordinary files
    try:
        yield tmp_path
        _fsync(tmp_path, os.O_RDONLY)
        os.replace(tmp_path, path)
        _fsync(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except Exception as err:
        tmp_path.unlink(missing_ok=True)  # first: what is free is then said right
        _raise_unwritten(path, err)
        raise
    finally:
        tmp_path.unlink(missing_ok=True)


def _raise_unwritten(path: Path, err: Exception) -> None:
    """Raise the ``UserError`` naming ``path`` that writing it failed for ``err``'s
    reason, a full disk or a folder it may not write in; return for any other."""
    if disk_full(err) is not None:
        raise no_space(path) from err
    denied = refused(err)
    if denied is not None:
        raise not_writable(path, denied) from err


def _fsync(path: Path, flags: int) -> None:
    """Flush ``path``'s data (a file) or its entries (a directory) to the disk.

    A read-only descriptor suffices on Linux; the caller's own handle is
    closed by now (it was opened inside ``atomic_path``'s block), so this
    one is opened afresh.
    """
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[tuple[Path, int]]:
    """Delete the temp files ``atomic_path`` made for ``path`` and a killed process left.

    A SIGKILL mid-write runs no ``finally``; a checkpoint's temporaries can be
    gigabytes. Only ``path``'s own pattern is matched, never other files.
    Call it only where no other process may be writing ``path`` right now (a
    stage's checkpoint: one process opens it). Returns each removed file with
    its size in bytes.
    """
    path = Path(path)
    pattern = re.compile(re.escape(f".{path.name}.") + TEMP_RANDOM + re.escape(_TEMP_SUFFIX))
    if not path.parent.is_dir():
        return []
    removed: list[tuple[Path, int]] = []
    for entry in sorted(path.parent.iterdir()):
        if pattern.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink():
            size = entry.stat().st_size
            entry.unlink(missing_ok=True)
            removed.append((entry, size))
    return removed


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def save_torch(path: str | os.PathLike[str], obj: Any) -> None:
    """torch.save, byte-identical for identical content, straight into the temp file.

    Saving to a path names the archive's inner folder after that (random
    temp) file; saving to an open file, as to a buffer, does not, so reruns
    hash the same. No copy of the whole archive is held in memory: torch
    writes one tensor at a time (a WideResNet's SWAG checkpoint is gigabytes).
    torch is imported here, not at the top: stages that only write JSON
    (validate, report) would otherwise pay its ~2 s import. The zip members'
    CRC-32s, which ``torch_damage`` checks, are written even where torch's
    ``compute_crc32`` was turned off (it would write zeros).
    """
    import torch
    from torch.utils.serialization import config

    with atomic_path(path) as tmp, tmp.open("wb") as f, config.patch({"save.compute_crc32": True}):
        torch.save(obj, f)


def torch_damage(path: str | os.PathLike[str]) -> str | None:
    """Why the bytes of ``path`` (a ``save_torch`` file) are not those saved, or None if
    every zip member's CRC-32 matches: torch's reader skips them, so a flipped byte
    inside a tensor loads as a different number. Reading 100 MB takes ~0.02 s."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except Exception as err:  # zipfile raises many types on damaged headers
        return f"not a readable zip archive: {err}"
    return None if bad is None else f"CRC-32 mismatch in {bad}"


def write_npz(path: str | os.PathLike[str], arrays: dict[str, Any]) -> None:
    """Numpy arrays as an ``.npz`` (read with ``numpy.load``), byte-identical for identical
    arrays: ``numpy.savez`` stamps each member with the current time, this does not."""
    import zipfile

    import numpy as np

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(
                member, np.ascontiguousarray(arrays[name]), allow_pickle=False
            )
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, member.getvalue())
    write_bytes(path, buf.getvalue())


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_csv(path: str | os.PathLike[str], rows: list[dict[str, Any]]) -> None:
    """Write rows as CSV; floats in repr precision. The columns are every row's keys in
    the order first seen; a row without one has an empty cell (a training history's
    epochs without a monitoring point)."""
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    header = list(dict.fromkeys(k for row in rows for k in row))
    lines = [",".join(header)]
    lines += [",".join(_csv_cell(row[k]) if k in row else "" for k in header) for row in rows]
    write_text(path, "\n".join(lines) + "\n")


def _csv_cell(value: Any) -> str:
    if isinstance(value, float):  # float(): numpy 2's repr of its float64 is np.float64(x)
        return repr(float(value))
    return str(value)
