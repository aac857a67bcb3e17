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


def test_stages_side_by_side_share_one_parent_and_all_reach_its_summary(
    tmp_path: Path, mlflow_db: str
) -> None:
    uri = mlflow_db
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
    proc.stdout.close()
    with serialized(uri, "other"), serialized(uri, "k"):  # free again, and per name
        pass


# Read a count, wait, write it plus one: without mutual exclusion increments are lost.
COUNTER = """
import pathlib, sys, time
from bayesavg.tracking.serialized import serialized
uri, count = sys.argv[1], pathlib.Path(sys.argv[2])
rounds, start = int(sys.argv[3]), float(sys.argv[4])
while time.time() < start:
    time.sleep(0.001)
for _ in range(rounds):
    with serialized(uri, "k"):
        value = int(count.read_text())
        time.sleep(0.002)
        count.write_text(str(value + 1))
"""


def test_the_lock_leaves_no_file_behind_and_still_excludes(tmp_path: Path) -> None:
    """Each holder removes the lock file as it lets go (none piles up in the temporary
    folder), and a waiter on a removed file takes the lock again on the new one: four
    processes incrementing a shared count 25 times each lose no increment."""
    uri = f"sqlite:///{tmp_path / 'x.db'}"
    with serialized(uri, "k"):
        assert Path(lock_path(uri, "k")).exists()
    assert not Path(lock_path(uri, "k")).exists()
    count = tmp_path / "count"
    count.write_text("0")
    start = str(time.time() + 2)
    procs = [
        subprocess.Popen([sys.executable, "-c", COUNTER, uri, str(count), "25", start])
        for _ in range(4)
    ]
    assert [proc.wait(timeout=120) for proc in procs] == [0] * 4
    assert count.read_text() == "100"
    assert not Path(lock_path(uri, "k")).exists()
