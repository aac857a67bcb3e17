"""A team's MLflow tracking server for the tests: ``mlflow server`` with its own SQLite
database and artifact folder on a free localhost port, started and stopped by the test
that needs it (``running_server``); ``kill`` takes it down mid-test, ``start`` brings it
back on the same port and store. ``ErrorProxy`` stands in front of it as a load
balancer whose backend fails: it forwards every request until told to answer 503."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pipeline_repo import PYTHON, env

from bayesavg.tracking.spool import check_reachable
from bayesavg.tracking.worker import Tracker

BIN = Path(PYTHON).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session(sid: int) -> list[tuple[str, int]]:
    """The processes of session ``sid`` (a server started in its own): each one's command
    line and resident memory in bytes."""
    found = []
    page = os.sysconf("SC_PAGE_SIZE")
    for proc in Path("/proc").iterdir():
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_text().replace("\0", " ").strip()
        except (OSError, IndexError):
            continue  # gone meanwhile, or not a process
        if len(fields) > 21 and int(fields[3]) == sid:
            found.append((cmdline, int(fields[21]) * page))
    return found


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
            # without MLflow 3's GenAI job runner (scripts/ui_server.py): its 7 processes
            # would only take CPU from the tests beside this one
            env=env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
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


class ErrorProxy:
    """An HTTP proxy to ``upstream`` (host, port) on a free port. ``fail()`` makes it
    answer every request 503 (``status``) until ``heal()``; ``fail_when(test)`` does so from
    the first request for which ``test(method, path, body)`` holds, that request included.
    Without an upstream it only answers ``status``."""

    def __init__(self, upstream: MlflowServer | None, status: int = 503) -> None:
        self.upstream = upstream
        self.status = status
        self.failing = upstream is None
        self.failed = 0  # requests answered 503
        self.headers: list[dict[str, str]] = []  # each request's headers, in order
        self._when: Callable[[str, str, bytes], bool] | None = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                proxy.headers.append(dict(self.headers.items()))
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy._when is not None and proxy._when(self.command, self.path, body):
                    proxy.failing, proxy._when = True, None
                if proxy.failing or proxy.upstream is None:
                    proxy.failed += 1
                    self.send_response(proxy.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail(self) -> None:
        self.failing = True

    def fail_when(self, test: Callable[[str, str, bytes], bool]) -> None:
        self._when = test

    def heal(self) -> None:
        self.failing, self._when = False, None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def server_worker(uri: str, spool_dir: Path) -> tuple[Tracker, subprocess.Popen[str]]:
    """A tracking worker as a stage starts one against the server at ``uri`` (artifact
    location "", as ``default_store`` gives for a server: the server's own store), spooling
    into ``spool_dir``, once it has said the server answers; and its process."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "bayesavg.tracking.worker", uri, "", str(spool_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(MLFLOW_TRACKING_URI=uri),
    )
    tracker = Tracker(proc, uri)
    assert tracker.unreachable() is None
    return tracker, proc
