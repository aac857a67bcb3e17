"""One process at a time on a pipeline execution's parent run.

An execution's stages may run side by side (``scripts/repro.py``), each with its own
tracking worker. Two of them must not both create the execution's parent run (the
first one to find none creates it), nor interleave their read-modify-write of its
summary, which each stage rewrites whole, nor both tag the experiment (MLflow's SQL
store fails the second insert of the same tag). An advisory lock (``flock``) per store and
parent serializes both across the processes of this machine, where those stages run.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


def lock_path(tracking_uri: str, name: str) -> str:
    """The lock file for ``name`` (an execution key, a parent run id, an experiment) in
    this store."""
    digest = hashlib.sha256(f"{tracking_uri}\0{name}".encode()).hexdigest()[:24]
    return os.path.join(tempfile.gettempdir(), f"bayesavg-{os.getuid()}-execution-{digest}.lock")


@contextmanager
def serialized(tracking_uri: str, name: str) -> Iterator[None]:
    """Hold the lock for ``name`` in ``tracking_uri`` while the block runs; released when
    the process ends too, so a killed stage never leaves it held.

    The holder removes the lock file before it lets go, so none is left behind in the
    temporary folder (one per execution would pile up). A process that was waiting on
    the removed file finds, once it holds it, that the path is no longer that file (or
    gone) and takes the lock again on the path's current file.
    """
    path = lock_path(tracking_uri, name)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(path)
        finally:
            os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the open file ``fd``."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)
