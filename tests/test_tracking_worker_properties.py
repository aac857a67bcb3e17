"""The worker's and the locks' promises found untested by mutation of
``bayesavg.tracking`` (worker, orphans, store): a worker's later run left open when its
stage vanishes ends KILLED, and a sweep and a resuming stage take a run's lock in turn,
so the run taken over is never ended under the stage that resumed it."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from test_tracking_properties import _open
from test_tracking_recovery_properties import _calls, _dead_pid, _running

from bayesavg.tracking import orphans, store
from bayesavg.tracking.mlflow_run import FAILURE_TAG
from bayesavg.tracking.serialized import serialized
from bayesavg.tracking.worker import DIED, serve

Store = tuple[str, str]


def test_a_later_run_left_open_ends_killed_though_an_earlier_one_finished(
    mlflow_store: Store,
) -> None:
    """A stage with several units (one run each) dies in its second: the first stays
    FINISHED, the second ends KILLED, saying why."""
    start = {"op": "start", "experiment": "e", "tags": {}, "inputs": {}}
    out = io.StringIO()
    calls = _calls(
        {**start, "run_name": "evaluate@a"},
        {"op": "end", "status": "FINISHED"},
        {**start, "run_name": "evaluate@b"},
        {"op": "log_metrics", "metrics": {"nll": 1.0}},
    )  # then stdin closes: the stage is gone
    assert serve(*mlflow_store, calls, out) == 0
    first, second = (json.loads(line)["run_id"] for line in out.getvalue().splitlines()[1:])
    client = MlflowClient(tracking_uri=mlflow_store[0])
    assert client.get_run(first).info.status == "FINISHED"
    found = client.get_run(second)
    assert found.info.status == "KILLED" and found.data.tags[FAILURE_TAG] == DIED


class _Watched:
    """A client that says when ``get_run`` is first called."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.read = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def get_run(self, run_id: str) -> Any:
        self.read.set()
        return self._client.get_run(run_id)


def test_the_sweep_checks_a_run_only_once_a_resuming_stage_lets_go(
    mlflow_store: Store,
) -> None:
    """While a resuming stage holds the run's lock (``store.open_run``), the sweep waits;
    it then finds the run owned by a live process and leaves it RUNNING."""
    found = _running(mlflow_store, f"{orphans.machine()}:{_dead_pid()}:1")
    run_id = found.info.run_id
    client = _Watched(MlflowClient(tracking_uri=mlflow_store[0]))
    ended: list[list[str]] = []
    sweep = threading.Thread(
        target=lambda: ended.append(
            orphans.sweep(client, found.info.experiment_id, mlflow_store[0])
        )
    )
    with serialized(mlflow_store[0], run_id):  # as a stage resuming the run
        sweep.start()
        assert not client.read.wait(1), "the sweep read the run under a resuming stage's lock"
        client.set_tag(run_id, orphans.OWNER_TAG, orphans.owner())
    sweep.join(timeout=60)
    assert ended == [[]]
    assert client.get_run(run_id).info.status == "RUNNING"


def test_a_stage_resuming_a_run_waits_while_the_sweep_holds_it(
    mlflow_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other side: a resuming stage takes the run over only once the sweep that holds
    its lock has let go, so the sweep's KILLED does not land after the takeover."""
    killed = _open(mlflow_store, "finetune@a")
    killed.terminate("KILLED", "interrupted")
    _open(mlflow_store, "other")  # this process has swept the experiment already
    took = threading.Event()
    real = orphans.owner

    def owner(pid: int | None = None) -> str:
        took.set()
        return real(pid)

    monkeypatch.setattr(store.orphans, "owner", owner)
    resumed: list[str] = []
    resume = threading.Thread(
        target=lambda: resumed.append(
            _open(mlflow_store, "finetune@a", resume=killed.run_id).run_id
        )
    )
    with serialized(mlflow_store[0], killed.run_id):  # as the sweep checking the run
        resume.start()
        assert not took.wait(1), "the run was taken over under the sweep's lock"
    resume.join(timeout=60)
    assert resumed == [killed.run_id]
    found = MlflowClient(tracking_uri=mlflow_store[0]).get_run(killed.run_id)
    assert found.info.status == "RUNNING" and found.data.tags[orphans.OWNER_TAG] == real()


def test_a_stage_finds_its_parent_under_the_lock_the_sweep_takes_for_it(
    mlflow_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep ends a parent left RUNNING under the lock named by the parent's
    execution tag; a stage taking that parent over must wait on the same lock, also for
    a DVC experiment name with a quote (``dvc exp run -n "bob's"``), which the tag drops."""
    watched = threading.Event()
    real = store._parent_run

    def parent_run(*args: Any) -> str:
        watched.set()
        return real(*args)

    monkeypatch.setattr(store, "_parent_run", parent_run)
    execution = {"key": "host:1:2:bob's", "name": "bob's"}
    _open(mlflow_store, "validate")  # the experiment exists, this process has swept it
    stage = threading.Thread(target=lambda: _open(mlflow_store, "finetune@a", parent=execution))
    with serialized(mlflow_store[0], "host:1:2:bobs"):  # the sweep, on a parent tagged so
        stage.start()
        assert not watched.wait(1), "the parent was looked up under the sweep's lock"
    stage.join(timeout=60)
    assert watched.is_set()
