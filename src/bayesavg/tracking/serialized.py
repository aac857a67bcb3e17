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
    the process ends too, so a killed stage never leaves it held."""
    fd = os.open(lock_path(tracking_uri, name), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
