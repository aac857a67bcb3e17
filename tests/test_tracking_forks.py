"""Tracking workers forked from one warm server (``bayesavg.tracking.forks``): a forked
worker is the stage's own, in its directory, environment and streams; a stage without
a usable server spawns its worker as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from bayesavg.tracking import forks
from bayesavg.tracking.worker import Tracker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import tracking_forks

# A stage that opens a run through the server, says its id, and waits to be killed.
STAGE = (
    "import sys, time\n"
    "from bayesavg.tracking.worker import Tracker\n"
    "tracker = Tracker.spawn(sys.argv[1], sys.argv[2])\n"
    "with tracker.run('s', experiment='e', tags={}, inputs={}) as run:\n"
    "    print(type(tracker._proc).__name__, run.run_id, flush=True)\n"
    "    time.sleep(120)\n"
)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_forked_worker_works_in_the_stage_s_directory(
    forks_server: dict[str, str],
    mlflow_store: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    for key, value in forks_server.items():
        monkeypatch.setenv(key, value)
    tracker = Tracker.spawn(*mlflow_store)
    pid = tracker._proc.pid
    assert type(tracker._proc).__name__ == "Forked" and pid != os.getpid()
    with tracker.run("s", experiment="e", tags={}, inputs={}) as run:
        _ = run.run_id  # the worker has answered: it is set up
        assert Path(f"/proc/{pid}/cwd").resolve() == tmp_path.resolve()
        run.log_metrics({"m": 1.0})
    assert MlflowClient(tracking_uri=mlflow_store[0]).get_run(run.run_id).info.status == "FINISHED"
    assert tracker._proc.wait() == 0


def test_a_killed_stage_leaves_its_forked_worker_to_mark_the_run_killed(
    forks_server: dict[str, str], mlflow_store: tuple[str, str], tmp_path: Path
) -> None:
    stage = subprocess.Popen(
        [sys.executable, "-c", STAGE, *mlflow_store],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **forks_server},
        cwd=tmp_path,
    )
    assert stage.stdout is not None
    kind, run_id = stage.stdout.readline().split()
    assert kind == "Forked"
    stage.kill()  # SIGKILL: the stage says nothing; its pipe to the worker closes
    stage.wait()
    stage.stdout.close()
    client = MlflowClient(tracking_uri=mlflow_store[0])
    deadline = time.monotonic() + 30
    while client.get_run(run_id).info.status == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.get_run(run_id).info.status == "KILLED"


def test_without_a_server_the_stage_spawns_its_worker(
    mlflow_store: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(forks.FORKS_ENV, str(tmp_path / "no-such-socket"))
    before = _open_fds()
    assert forks.request([*mlflow_store]) is None
    assert _open_fds() == before  # the pipes meant for the worker are closed again
    tracker = Tracker.spawn(*mlflow_store)
    assert type(tracker._proc).__name__ == "Popen"
    tracker.discard()


def test_a_server_of_another_interpreter_is_not_used(
    forks_server: dict[str, str], mlflow_store: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its workers would run another environment's packages: the stage spawns its own."""
    for key, value in forks_server.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "prefix", "/elsewhere/venv")
    before = _open_fds()
    assert forks.request([*mlflow_store]) is None
    assert _open_fds() == before


def test_the_server_stops_and_leaves_nothing_when_its_block_ends() -> None:
    with tracking_forks.serving() as env:
        path = Path(env[forks.FORKS_ENV])
        assert path.is_socket()
    assert not path.exists() and not path.parent.exists()


def test_the_child_adopts_the_stage_s_environment_whole(tmp_path: Path) -> None:
    """Only the stage's variables: none of the server's is left (a fork, as the server
    forks its workers)."""
    read, write = os.pipe()
    message = {"cwd": str(tmp_path), "env": {"ONLY": "stage"}, "argv": ["uri", "artifacts"]}
    pid = os.fork()
    if pid == 0:
        try:
            tracking_forks.adopt(message)
            seen = [os.getcwd(), json.dumps(dict(os.environ)), json.dumps(sys.argv[1:])]
            os.write(write, "\n".join(seen).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        cwd, environ, argv = f.read().splitlines()
    os.waitpid(pid, 0)
    assert Path(cwd) == tmp_path
    assert json.loads(environ) == {"ONLY": "stage"}
    assert json.loads(argv) == ["uri", "artifacts"]
