"""Runs a SIGKILL of the whole process group left RUNNING (the stage and its tracking
worker died together) are ended KILLED, with a note, by the next process that opens a
run in the experiment; runs of live processes and of other machines are left alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from mlflow.tracking import MlflowClient

from bayesavg.tracking import orphans, store
from bayesavg.tracking.mlflow_run import NOTE_TAG, PIPELINE_TAG
from bayesavg.tracking.store import open_run

# A tracked stage in its own process group: prints its run's id and parent's, then waits.
STAGE = """
import sys, time
from bayesavg.tracking.worker import Tracker

with Tracker.spawn(sys.argv[1], sys.argv[2]).run(
    sys.argv[3], experiment="e", tags={}, inputs={},
    parent={"key": "execution-1", "name": "dvc repro"},
) as run:
    print(run.run_id, flush=True)
    time.sleep(120)
"""


@pytest.fixture(autouse=True)
def fresh_process() -> Iterator[None]:
    """Each test is a new process as far as sweeping goes (one sweep per experiment)."""
    store._SWEPT.clear()
    yield
    store._SWEPT.clear()


def _killed_stage(mlflow_store: tuple[str, str], name: str) -> str:
    """A stage whose whole group (stage and worker) was SIGKILLed: its run's id."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STAGE, *mlflow_store, name],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    owner = MlflowClient(tracking_uri=mlflow_store[0]).get_run(run_id).data.tags[orphans.OWNER_TAG]
    deadline = time.monotonic() + 30
    while not orphans.gone(owner):  # the worker, killed too, may take a moment to end
        assert time.monotonic() < deadline, f"{owner} outlived SIGKILL"
        time.sleep(0.01)
    return run_id


def _open(mlflow_store: tuple[str, str], name: str = "report") -> object:
    uri, artifacts = mlflow_store
    return open_run(name, tracking_uri=uri, artifact_location=artifacts, experiment="e")


def test_a_group_sigkill_leaves_runs_the_next_run_ends_killed(
    mlflow_store: tuple[str, str],
) -> None:
    run_id = _killed_stage(mlflow_store, "finetune@x")
    client = MlflowClient(tracking_uri=mlflow_store[0])
    killed = client.get_run(run_id)
    parent_id = killed.data.tags["mlflow.parentRunId"]
    assert killed.info.status == "RUNNING", "nothing was left to end it"
    assert client.get_run(parent_id).info.status == "RUNNING"
    _open(mlflow_store).terminate()
    ended = client.get_run(run_id)
    assert ended.info.status == "KILLED" and ended.info.end_time is not None
    assert ended.data.tags[orphans.ENDED_TAG].startswith("KILLED: the process that tracked it")
    parent = client.get_run(parent_id)
    assert parent.info.status == "KILLED", "the execution did not finish"
    summary = json.loads(parent.data.tags[PIPELINE_TAG])
    assert summary["failed"] == {"finetune@x": "KILLED"}
    why = ended.data.tags[orphans.ENDED_TAG].removeprefix("KILLED: ")
    assert summary["why"] == {"finetune@x": why}
    assert f"Did not finish: finetune@x (KILLED: {why})." in parent.data.tags[NOTE_TAG]


def test_a_resumed_run_is_running_again_and_owned_by_its_new_process(
    mlflow_store: tuple[str, str],
) -> None:
    """The stage run again reopens its killed run (swept on the way in) and owns it, so a
    later sweep leaves it running."""
    run_id = _killed_stage(mlflow_store, "finetune@x")
    uri, artifacts = mlflow_store
    resumed = open_run(
        "finetune@x", tracking_uri=uri, artifact_location=artifacts, experiment="e", resume=run_id
    )
    client = MlflowClient(tracking_uri=uri)
    again = client.get_run(run_id)
    assert resumed.run_id == run_id and again.info.status == "RUNNING"
    assert again.data.tags[orphans.OWNER_TAG] == orphans.owner()
    swept = again.data.tags[store.RESUMED_TAG]  # what the sweep said, off its page now
    assert swept.startswith("KILLED: the process that tracked it"), "it was swept first"
    assert orphans.ENDED_TAG not in again.data.tags
    store._SWEPT.clear()
    _open(mlflow_store).terminate()
    assert client.get_run(run_id).info.status == "RUNNING", "its owner is alive"


def test_runs_of_live_processes_and_other_machines_are_left_alone(
    mlflow_store: tuple[str, str],
) -> None:
    uri = mlflow_store[0]
    client = MlflowClient(tracking_uri=uri)
    live = _open(mlflow_store, "finetune@live")  # this process: alive
    elsewhere = _open(mlflow_store, "finetune@elsewhere")
    client.set_tag(elsewhere.run_id, orphans.OWNER_TAG, "other-host/boot:1:1")
    reused_pid = _open(mlflow_store, "finetune@reused")
    # this process's pid with another start time: a process that had the pid before it
    client.set_tag(reused_pid.run_id, orphans.OWNER_TAG, f"{orphans.machine()}:{os.getpid()}:1")
    store._SWEPT.clear()
    _open(mlflow_store).terminate()
    status = {r: client.get_run(r).info.status for r in (live.run_id, elsewhere.run_id)}
    assert status == {live.run_id: "RUNNING", elsewhere.run_id: "RUNNING"}
    assert client.get_run(reused_pid.run_id).info.status == "KILLED"


def test_a_parent_left_running_without_a_child_ends_killed_only_then(
    mlflow_store: tuple[str, str],
) -> None:
    """A stage killed between making its execution's parent RUNNING and starting its run
    leaves the parent RUNNING; while another stage of it runs, the parent stays."""
    uri, artifacts = mlflow_store
    parent = {"key": "execution-2", "name": "dvc repro"}
    child = open_run(
        "finetune@a", tracking_uri=uri, artifact_location=artifacts, experiment="e", parent=parent
    )
    client = MlflowClient(tracking_uri=uri)
    parent_id = client.get_run(child.run_id).data.tags["mlflow.parentRunId"]
    dead = f"{orphans.machine()}:{os.getpid()}:1"
    client.set_tag(parent_id, orphans.OWNER_TAG, dead)
    store._SWEPT.clear()
    _open(mlflow_store).terminate()
    assert client.get_run(parent_id).info.status == "RUNNING", "finetune@a runs in it"
    child.record_in_parent("finetune@a", {}, "FINISHED")  # ends the parent FINISHED
    client.update_run(parent_id, status="RUNNING")  # a next stage made it RUNNING, then died
    client.set_tag(parent_id, orphans.OWNER_TAG, dead)
    child.terminate()
    store._SWEPT.clear()
    _open(mlflow_store).terminate()
    assert client.get_run(parent_id).info.status == "KILLED"


def test_the_owner_is_this_process_until_it_ends() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    value = orphans.owner(proc.pid)
    assert value.startswith(orphans.machine() + ":") and not orphans.gone(value)
    proc.kill()
    proc.wait()
    assert orphans.gone(value)
    assert not orphans.gone(orphans.owner())


def test_a_late_end_drops_the_sweep_s_note(mlflow_store: tuple[str, str]) -> None:
    """A run whose calls a tracking outage spooled looks orphaned until the spool is
    replayed: its own end, when it comes, wins, and the note goes."""
    run_id = _killed_stage(mlflow_store, "finetune@x")
    _open(mlflow_store).terminate()
    client = MlflowClient(tracking_uri=mlflow_store[0])
    assert orphans.ENDED_TAG in client.get_run(run_id).data.tags
    uri = mlflow_store[0]
    from bayesavg.tracking.mlflow_run import Run

    late = Run(client, run_id, uri)
    late.record_in_parent("finetune@x", None, "FINISHED")
    late.terminate("FINISHED")
    ended = client.get_run(run_id)
    assert ended.info.status == "FINISHED" and orphans.ENDED_TAG not in ended.data.tags
