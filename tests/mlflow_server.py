"""A team's MLflow tracking server for the tests: ``mlflow server`` with its own SQLite
database and artifact folder on a free localhost port, started and stopped by the test
that needs it (``running_server``); ``kill`` takes it down mid-test, ``start`` brings it
back on the same port and store."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline_repo import PYTHON, env

from bayesavg.tracking.spool import check_reachable

BIN = Path(PYTHON).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class MlflowServer:
    folder: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def artifacts(self) -> Path:
        return self.folder / "server-artifacts"

    def start(self) -> None:
        cmd = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--workers", "1", "--backend-store-uri", f"sqlite:///{self.folder / 'server.db'}"]
        cmd += ["--artifacts-destination", str(self.artifacts)]
        self.proc = subprocess.Popen(  # its own group: uvicorn's workers die with it
            cmd,
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.time() + 90
        while check_reachable(self.uri) is not None:
            if time.time() > deadline or self.proc.poll() is not None:
                raise AssertionError("mlflow server did not start")
            time.sleep(0.5)

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        deadline = time.time() + 20
        while time.time() < deadline:  # the port refuses once every worker is gone
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.2)
        raise AssertionError(f"mlflow server still answers on port {self.port}")


@contextlib.contextmanager
def running_server(folder: Path) -> Iterator[MlflowServer]:
    server = MlflowServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.kill()
