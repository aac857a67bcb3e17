"""Tracking promises a second mutation audit of ``bayesavg.tracking`` found untested: a
parent taken over from FINISHED is owned by the stage that took it (no sweep ends it
before that stage's run exists), an untagged experiment is tagged under its lock, a
worker whose server is down at the start exits 2, and a forked worker whose server went
away is not taken to have ended well."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from test_tracking_properties import _client, _open, _stage
from test_tracking_recovery_properties import _dead_pid

from bayesavg.tracking import forks, orphans, store
from bayesavg.tracking.mlflow_run import PARENT_TAG, store_client
from bayesavg.tracking.serialized import serialized
from bayesavg.tracking.worker import Tracker, TrackingError, serve

Store = tuple[str, str]


def test_a_finished_parent_taken_over_is_not_swept_before_the_stage_s_run_exists(
    mlflow_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An execution's parent that an earlier stage (its process gone) ended FINISHED is
    RUNNING again once the next stage starts, and owned by it: another process's sweep
    landing before that stage's own run exists leaves the parent RUNNING."""
    first = _stage(mlflow_store, "prepare")
    first.record_in_parent("prepare", {}, "FINISHED")
    first.terminate()
    client = _client(mlflow_store)
    parent_id = client.get_run(first.run_id).data.tags[PARENT_TAG]
    client.set_tag(parent_id, orphans.OWNER_TAG, f"{orphans.machine()}:{_dead_pid()}:1")
    experiment_id = client.get_run(parent_id).info.experiment_id
    swept: list[list[str]] = []
    real = store._upstream

    def sweep_meanwhile(*args: Any) -> dict[str, str]:  # after the parent, before the run
        swept.append(orphans.sweep(client, experiment_id, mlflow_store[0]))
        return real(*args)

    monkeypatch.setattr(store, "_upstream", sweep_meanwhile)
    _stage(mlflow_store, "train")
    assert swept == [[]]
    assert client.get_run(parent_id).info.status == "RUNNING"


def test_a_worker_whose_server_is_down_at_the_start_says_why_and_exits_2(
    tmp_path: Path,
) -> None:
    """Its only answer is the one line the stage stops with; its exit code is 2 (what a
    forked worker's server reports to the stage), and nothing is spooled."""
    out = io.StringIO()
    uri = "http://127.0.0.1:9"  # nothing listens there
    assert serve(uri, "", io.StringIO(""), out, tmp_path / "spool") == 2
    [answer] = (json.loads(line) for line in out.getvalue().splitlines())
    assert answer["ready"] is False
    assert f"{uri} is unreachable (Connection refused)" in answer["error"]
    assert "\n" not in answer["error"] and not (tmp_path / "spool").exists()


def test_a_forked_worker_whose_server_went_away_has_not_ended_well() -> None:
    """The server sends a forked worker's exit code on the stage's connection; when the
    connection ends without it, the worker's end is unknown: closing the tracker fails,
    saying so, and does not pass for a worker that ended well."""
    conn, server = socket.socketpair()
    calls, answers = os.pipe(), os.pipe()
    with os.fdopen(calls[0]) as worker_in, os.fdopen(answers[1], "w"):
        forked = forks.Forked(
            conn,
            conn.makefile("r"),
            _dead_pid(),
            os.fdopen(calls[1], "w"),
            os.fdopen(answers[0]),
        )
        server.close()  # gone before it sent the worker's exit code
        with pytest.raises(TrackingError, match=r"worker stopped \(exit code 1\)"):
            Tracker(forked).close()
        assert worker_in.read() == ""  # the stage let go of its calls pipe


def test_a_stage_tags_an_untagged_experiment_only_under_its_lock(
    mlflow_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An experiment made without the model-training tag (by hand, or an older version):
    the first stages to open runs in it tag it one at a time (MLflow's SQL store fails
    the second of two inserts of one tag), so a stage waits while another holds the
    experiment's lock, then sees the tag set and opens its run."""
    uri = mlflow_store[0]
    experiment_id = _client(mlflow_store).create_experiment("e", artifact_location=mlflow_store[1])
    client = store_client(uri)
    tagging = threading.Event()
    real = client.set_experiment_tag

    def set_experiment_tag(*args: Any) -> None:
        tagging.set()
        real(*args)

    monkeypatch.setattr(client, "set_experiment_tag", set_experiment_tag)
    opened: list[str] = []
    stage = threading.Thread(target=lambda: opened.append(_open(mlflow_store, "train").run_id))
    with serialized(uri, "experiment\0e"):  # as another stage tagging it
        stage.start()
        assert not tagging.wait(1), "the experiment was tagged under another stage's lock"
    stage.join(timeout=60)
    assert tagging.is_set() and len(opened) == 1
    tags = _client(mlflow_store).get_experiment(experiment_id).tags
    assert all(tags.get(key) == value for key, value in store.EXPERIMENT_KIND.items())
