"""The stages' processes under ``scripts/repro.py``: each in a session of its own, and the
signals to repro passed on to their groups once.

A terminal's Ctrl-C reaches repro alone (the stages lead sessions of their own); repro
raises it as ``Interrupted`` and ``Children.stop`` passes it, or any signal to repro, to
each running stage's group, which gets ``STOP_SECONDS`` to stop before it is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import Any

import psutil

# A signal's grace: the stages' ``finally`` blocks and tracked runs' ends (KILLED) run
STOP_SECONDS = 30.0
INTERRUPTED = (
    "interrupted by {}: stages stopped; rerun to continue (finished stages are kept,"
    " pretrain and fine-tuning resume from their last checkpoint)"
)


class Interrupted(KeyboardInterrupt):
    """A signal (``args[0]``) raised as Ctrl-C is, so no ``except Exception`` swallows it."""


class Signals:
    """SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` while ``armed`` (one, so a clean-up
    runs whole); one ignored from the start (``nohup``, a background job) stays so."""

    def __init__(self) -> None:
        self.armed = True
        caught = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        self.previous = {signum: signal.getsignal(signum) for signum in caught}

    def __enter__(self) -> Signals:
        for signum, previous in self.previous.items():
            if previous != signal.SIG_IGN:
                signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)

    def _handle(self, signum: int, frame: object) -> None:
        if self.armed:
            self.armed = False  # a second signal waits for the stop under way
            raise Interrupted(signum)


def _left(groups: set[int]) -> bool:
    """Whether a process of ``groups`` runs (an orphan's zombie, which no init may reap, not)."""
    for pid in psutil.pids():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(pid) in groups and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
    return False


class Children:
    """The stages' processes, each leading a session of its own: a terminal's Ctrl-C reaches
    this script alone, and ``stop`` passes it, or any signal to us, once to their groups."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen[Any]] = []
        self._stopping = False

    def start(self, cmd: list[str], **popen: Any) -> subprocess.Popen[Any] | None:
        """The stage's process; None once ``stop`` has begun (no stage starts after)."""
        with self._lock:
            if self._stopping:
                return None
            self._procs.append(subprocess.Popen(cmd, start_new_session=True, **popen))
            return self._procs[-1]

    def stop(self, signum: int, grace: float = STOP_SECONDS) -> None:
        """Send ``signum`` to the running stages' groups, give them ``grace`` seconds to
        end, then kill what is left (and wait 10 s at most: uninterruptible sleep)."""
        with self._lock:
            self._stopping = True
            groups = {p.pid for p in self._procs if p.returncode is None}
        for sent, seconds in ((signum, grace), (signal.SIGKILL, 10.0)):
            for pgid in groups:
                with contextlib.suppress(OSError):
                    os.killpg(pgid, sent)
            deadline = time.monotonic() + seconds
            while (left := _left(groups)) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not left:
                return
