"""Stages of one execution tracked side by side (scripts/repro.py): one parent run,
and every stage in its summary."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from bayesavg.tracking.serialized import lock_path, serialized

# One stage's tracking, started with the others at the same instant: open its run in
# the execution, record it in the parent, end it.
STAGE = """
import sys, time
from bayesavg.tracking.store import open_run
uri, artifacts, name, start = sys.argv[1:]
parent = {"key": "host:1:2:", "name": "dvc repro now"}
while time.time() < float(start):
    time.sleep(0.001)
run = open_run(name, tracking_uri=uri, artifact_location=artifacts, experiment="e",
               parent=parent)
run.record_in_parent(name, {}, "FINISHED")
run.terminate()
"""


def test_stages_side_by_side_share_one_parent_and_all_reach_its_summary(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    artifacts = (tmp_path / "mlartifacts").as_uri()
    client = MlflowClient(tracking_uri=uri)
    client.create_experiment("e", artifact_location=artifacts)  # as the validate stage's
    names = [f"finetune@t{i}" for i in range(4)]
    start = time.time() + 6  # after every process has imported mlflow
    procs = [
        subprocess.Popen([sys.executable, "-c", STAGE, uri, artifacts, name, str(start)])
        for name in names
    ]
    assert [proc.wait(timeout=120) for proc in procs] == [0] * len(names)
    exp = client.get_experiment_by_name("e")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.info.run_name == "dvc repro now"]
    assert len(parents) == 1
    summary = json.loads(parents[0].data.tags["bayesavg.stages"])
    assert set(summary["ran"]) == set(names)
    assert parents[0].info.status == "FINISHED"


def test_the_lock_is_one_per_store_and_name_and_held_across_processes(tmp_path: Path) -> None:
    assert lock_path("sqlite:///a.db", "k") != lock_path("sqlite:///b.db", "k")
    assert lock_path("sqlite:///a.db", "k") != lock_path("sqlite:///a.db", "k2")
    holder = (
        "import pathlib, sys, time; from bayesavg.tracking.serialized import serialized\n"
        "with serialized(sys.argv[1], 'k'):\n"
        "    print('held', flush=True); time.sleep(1); pathlib.Path(sys.argv[2]).touch()\n"
    )
    uri, done = f"sqlite:///{tmp_path / 'x.db'}", tmp_path / "done"
    proc = subprocess.Popen(
        [sys.executable, "-c", holder, uri, str(done)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    with serialized(uri, "k"):
        assert done.exists(), "the lock was taken while the other process held it"
    assert proc.wait(timeout=60) == 0
    with serialized(uri, "other"), serialized(uri, "k"):  # free again, and per name
        pass
