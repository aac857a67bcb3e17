"""``make ui``: the address of the project's experiment, read from the store without
mlflow, and the MLflow UI it starts (``scripts/ui_server.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow_server import free_port, session
from pipeline_repo import ROOT, env

from bayesavg.runtime.numerics import usable_cores
from bayesavg.tracking.spool import check_reachable

sys.path.insert(0, str(ROOT / "scripts"))
import ui_server
import ui_url


def test_the_address_opens_the_params_experiment(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    (tmp_path / "params.yaml").write_text("tracking: {experiment: mine}\n")
    assert "no experiment 'mine' in mlflow.db yet" in ui_url.url(tmp_path, 5000)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.create_experiment("other")
    assert "no experiment 'mine'" in ui_url.url(tmp_path, 5000)
    exp_id = client.create_experiment("mine")
    assert ui_url.url(tmp_path, 5001) == (
        f"http://127.0.0.1:5001/#/experiments/{exp_id}/runs?workflowType=machine_learning"
    )


def test_runs_left_running_by_a_gone_process_are_ended_first(tmp_path: Path) -> None:
    """`make ui` ends KILLED a run whose process is gone, as the next stage would, and
    leaves a live process's run RUNNING; with none RUNNING it needs no mlflow."""
    from mlflow.tracking import MlflowClient

    from bayesavg.tracking import orphans

    (tmp_path / "params.yaml").write_text("tracking: {experiment: mine}\n")
    assert ui_url.end_orphans(tmp_path) == []  # no store yet
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp_id = client.create_experiment("mine")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead_owner = orphans.owner(proc.pid)
    proc.kill()
    proc.wait()
    dead = client.create_run(exp_id, run_name="finetune@swag", tags={orphans.OWNER_TAG: dead_owner})
    live = client.create_run(
        exp_id, run_name="finetune@vi", tags={orphans.OWNER_TAG: orphans.owner()}
    )
    assert ui_url.end_orphans(tmp_path) == [f"finetune@swag ({dead.info.run_id})"]
    assert client.get_run(dead.info.run_id).info.status == "KILLED"
    assert orphans.ENDED_TAG in client.get_run(dead.info.run_id).data.tags
    assert client.get_run(live.info.run_id).info.status == "RUNNING"
    client.set_terminated(live.info.run_id)
    assert not ui_url.has_running(tmp_path / "mlflow.db", exp_id)
    check = (
        "import sys, pathlib, ui_url; ui_url.end_orphans(pathlib.Path(sys.argv[1])); "
        "assert 'mlflow' not in sys.modules"
    )
    subprocess.run(
        [sys.executable, "-c", check, str(tmp_path)],
        check=True,
        cwd=ROOT / "scripts",
    )


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 2), (4, 4), (16, 4)])
def test_the_ui_has_mlflow_s_four_workers_at_most_one_per_core(cores: int, expected: int) -> None:
    assert ui_server.workers(cores) == expected


def test_the_ui_s_job_runner_is_off_unless_the_user_turns_it_on() -> None:
    assert ui_server.environ({"PATH": "/bin"})[ui_server.JOB_RUNNER] == "false"
    assert ui_server.environ({ui_server.JOB_RUNNER: "true"})[ui_server.JOB_RUNNER] == "true"
    cmd = ui_server.command("sqlite:///x.db", Path("/a"), 5001)
    assert cmd[cmd.index("--workers") + 1] == str(ui_server.workers(usable_cores()))
    assert cmd[cmd.index("--port") + 1] == "5001" and cmd[1] == "ui"


@pytest.mark.slow  # a real `mlflow ui` with its web workers (~18 s on 2 cores)
def test_make_ui_prints_the_address_then_serves_without_mlflow_s_job_runner(
    tmp_path: Path,
) -> None:
    """The launcher `make ui` runs: the address first, then it becomes ``mlflow ui`` (Ctrl-C
    reaches MLflow itself), with no GenAI job runner beside it."""
    from mlflow.tracking import MlflowClient

    (tmp_path / "params.yaml").write_text("tracking: {experiment: mine}\n")
    exp_id = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").create_experiment("mine")
    port = free_port()
    launcher = [sys.executable, str(ROOT / "scripts" / "ui_server.py")]
    ui = subprocess.Popen(
        [*launcher, "--port", str(port), "--root", str(tmp_path)],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert ui.stdout is not None
        assert ui.stdout.readline().strip() == (
            f"Runs: http://127.0.0.1:{port}/#/experiments/{exp_id}/runs"
            "?workflowType=machine_learning"
        )
        deadline = time.monotonic() + 90
        while check_reachable(f"http://127.0.0.1:{port}") is not None:
            assert ui.poll() is None and time.monotonic() < deadline, "mlflow ui did not start"
            time.sleep(0.3)
        running = [cmdline for cmdline, _ in session(ui.pid)]
        assert any(" ui --backend-store-uri " in cmd for cmd in running), running
        assert not [cmd for cmd in running if "mlflow.server.jobs" in cmd], running
    finally:
        os.killpg(ui.pid, signal.SIGKILL)
        ui.wait()
