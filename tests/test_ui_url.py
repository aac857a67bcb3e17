"""``make ui``'s address: the project's experiment in the store, read without mlflow."""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline_repo import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
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
    import subprocess

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
