"""The server that forks tracking workers from one warm process, for ``repro.py``'s
stages (``bayesavg.tracking.forks`` says why, and is the stages' side).

It imports what a worker imports before its first call, then listens on a Unix
socket. For each stage that connects it receives the stage's request (arguments,
environment, working directory, Python environment) and three descriptors (the worker's
stdin and stdout pipes, the stage's stderr), forks, and the child becomes the worker
(``worker.main``). It waits for each worker and sends its exit code to its stage. It
is single-threaded, so a fork copies no lock another thread holds, and it opens no
store, so no database connection crosses a fork. It ignores Ctrl-C (the stages
decide) and stops when its stdin closes. ``serving`` runs one for a block of stages.

Usage: ``python scripts/tracking_forks.py SOCKET``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from bayesavg.runtime.entry import stops_held
from bayesavg.tracking import worker
from bayesavg.tracking.forks import FORKS_ENV, HANDSHAKE_SECONDS


@contextlib.contextmanager
def serving() -> Iterator[dict[str, str]]:
    """A server for the block's stages: yields the environment that points them to it,
    and stops it after (its workers have ended with their stages)."""
    folder = Path(tempfile.mkdtemp(prefix="bayesavg-forks-"))
    path = folder / "socket"
    proc = subprocess.Popen([sys.executable, __file__, str(path)], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + HANDSHAKE_SECONDS  # bound before its imports: ~0.1 s
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        yield {FORKS_ENV: str(path)}
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        path.unlink(missing_ok=True)
        folder.rmdir()


def _preload() -> None:
    """What a worker imports before its first call (``worker.serve``), imported once."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # as worker.main, before mlflow
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    gc.disable()
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401

    from bayesavg.tracking import spool, store  # noqa: F401

    gc.freeze()
    gc.enable()


def serve(path: str) -> None:
    """Accept stages on ``path`` and fork a worker for each until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the stages decide
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _preload()
    waiting: dict[int, socket.socket] = {}  # a worker's pid -> its stage's connection
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "stage")
    selector.register(wake_r, selectors.EVENT_READ, "ended")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "stop")
    while True:
        for key, _ in selector.select():
            if key.data == "stage":
                conn, _ = listener.accept()
                pid = _fork_for(conn, (listener, selector, wake_r, wake_w, waiting))
                if pid is not None:
                    waiting[pid] = conn
                else:
                    conn.close()
            elif key.data == "ended":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(waiting)
            elif not os.read(sys.stdin.fileno(), 4096):
                return


def _fork_for(conn: socket.socket, inherited: tuple[Any, ...]) -> int | None:
    """Read a stage's request and fork its worker; the worker's pid, or None when the
    request cannot be served (the stage is told why and spawns its own)."""
    fds: list[int] = []
    try:
        conn.settimeout(HANDSHAKE_SECONDS)
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        while data and not data.endswith(b"\n"):
            more = conn.recv(1 << 16)
            if not more:
                break
            data += more
        message = json.loads(data or b"{}")
        conn.settimeout(None)
        if len(fds) != 3 or message.get("python") != [sys.prefix, sys.version]:
            _send(conn, {"error": f"this server runs the Python of {sys.prefix}"})
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        with stops_held():  # the worker ignores them from its start on, as a spawned one
            pid = os.fork()
            if pid == 0:
                _become_worker(message, fds, conn, inherited)
        _send(conn, {"pid": pid})
        return pid
    except (OSError, ValueError):
        return None
    finally:
        for fd in fds:
            os.close(fd)


def _become_worker(
    message: dict[str, Any], fds: list[int], conn: socket.socket, inherited: tuple[Any, ...]
) -> None:
    """In the forked child: the stage's streams, directory and environment, then the
    worker's own ``main``, which ends the process."""
    try:
        listener, selector, wake_r, wake_w, waiting = inherited
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        selector.close()
        listener.close()
        conn.close()
        for other in waiting.values():
            other.close()
        os.close(wake_r)
        os.close(wake_w)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        adopt(message)
        worker.main()
    except BaseException:
        traceback.print_exc()
    os._exit(1)


def adopt(message: Mapping[str, Any]) -> None:
    """The stage's working directory, environment and worker arguments, in this process."""
    os.chdir(message["cwd"])
    os.environ.clear()
    os.environ.update(message["env"])
    sys.argv = [worker.__file__, *message["argv"]]


def _reap(waiting: dict[int, socket.socket]) -> None:
    """Send each ended worker's exit code to its stage."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
            conn.close()


def _send(conn: socket.socket, message: Mapping[str, Any]) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


if __name__ == "__main__":
    serve(sys.argv[1])
