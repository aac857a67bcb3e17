"""Tracking workers forked from one warm process, for a run of many stages: the stage's side.

Every tracked stage starts a tracking worker (``worker``), and each worker spends about
2 s of CPU importing mlflow and SQLAlchemy before its first call: 88 s of CPU over the
pipeline's 44 stages, on a 2-core machine whose stages already keep both cores busy.
``scripts/repro.py`` starts one server (``scripts/tracking_forks.py``) that imports all
that once, then forks a worker for each stage that asks, in a few milliseconds. A
forked worker is the same code as a spawned one (``worker.main``), with the stage's
arguments, environment, working directory and standard streams: the stage's pipes
become its stdin and stdout (passed over the server's Unix socket), the stage's stderr
its stderr. If the stage dies its pipe closes, and the worker marks its run KILLED, as
a spawned worker does. The server waits for each worker and sends its exit code back
on the stage's connection.

A stage asks when ``BAYESAVG_TRACKING_FORKS`` names the server's socket (``request``);
without it, or if the server cannot be reached or runs another Python environment, the
stage spawns its worker as before. The server lives beside ``scripts/repro.py``, which
alone starts it, so no stage's code depends on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Mapping
from typing import IO

FORKS_ENV = "BAYESAVG_TRACKING_FORKS"
HANDSHAKE_SECONDS = 30.0  # a stage waits this long for the server's answer


class Forked:
    """A worker forked for this stage: the part of ``subprocess.Popen`` ``Tracker`` uses."""

    def __init__(
        self, conn: socket.socket, answers: IO[str], pid: int, stdin: IO[str], stdout: IO[str]
    ) -> None:
        self._conn = conn
        self._answers = answers  # the server's lines: the pid (read), then the exit code
        self.pid = pid
        self.stdin: IO[str] | None = stdin
        self.stdout: IO[str] | None = stdout
        self.returncode: int | None = None

    def wait(self) -> int:
        """The worker's exit code, which the server sends when it has ended (1 if the
        server went away first: the worker's end is unknown)."""
        if self.returncode is None:
            code = 1
            with contextlib.suppress(OSError, ValueError):
                for line in self._answers:
                    found = json.loads(line)
                    if "exit" in found:
                        code = int(found["exit"])
                        break
            self._answers.close()
            self._conn.close()
            self.returncode = code
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def request(args: list[str], environ: Mapping[str, str] | None = None) -> Forked | None:
    """A worker for ``args`` (the worker's command-line arguments) from the server that
    ``BAYESAVG_TRACKING_FORKS`` names; None when there is none or it cannot serve."""
    env = dict(os.environ if environ is None else environ)
    path = env.get(FORKS_ENV)
    if not path:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    worker_in, stage_out = os.pipe()  # the stage writes calls, the worker reads them
    stage_in, worker_out = os.pipe()  # the worker answers, the stage reads
    answers: IO[str] | None = None  # the server's lines on the connection
    try:
        conn.settimeout(HANDSHAKE_SECONDS)
        conn.connect(path)
        message = {
            "python": [sys.prefix, sys.version],
            "argv": args,
            "env": env,
            "cwd": os.getcwd(),
        }
        data = (json.dumps(message) + "\n").encode()
        sent = socket.send_fds(conn, [data], [worker_in, worker_out, sys.stderr.fileno()])
        conn.sendall(data[sent:])
        answers = conn.makefile("r")
        answer = json.loads(answers.readline() or "{}")
        if "pid" not in answer:
            raise OSError(answer.get("error", "no answer"))
    except (OSError, ValueError):
        if answers is not None:
            answers.close()
        conn.close()
        for fd in (worker_in, stage_out, stage_in, worker_out):
            os.close(fd)
        return None
    conn.settimeout(None)
    os.close(worker_in)
    os.close(worker_out)
    stdin = os.fdopen(stage_out, "w")
    stdout = os.fdopen(stage_in, "r")
    return Forked(conn, answers, int(answer["pid"]), stdin, stdout)
