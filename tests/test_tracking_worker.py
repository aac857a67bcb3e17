"""The tracking worker: a stage's MLflow calls carried out in order by a helper process,
spawned by the stage or forked by ``scripts/repro.py``'s server (every test runs both)."""

from __future__ import annotations

import inspect
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from bayesavg.tracking import forks
from bayesavg.tracking.mlflow_run import FAILURE_TAG, NOTE_TAG, ROLLED_BACK_TAG, Run
from bayesavg.tracking.remote_run import RemoteRun
from bayesavg.tracking.store import RESUMED_TAG
from bayesavg.tracking.worker import DIED, Tracker, TrackingError


@pytest.fixture(autouse=True, params=["spawned", "forked"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.delenv(forks.FORKS_ENV, raising=False)
    if request.param == "forked":
        for key, value in request.getfixturevalue("forks_server").items():
            monkeypatch.setenv(key, value)
    yield request.param


def test_the_worker_comes_as_asked(mlflow_store: tuple[str, str], transport: str) -> None:
    tracker = Tracker.spawn(*mlflow_store)
    kind = type(tracker._proc).__name__
    tracker.discard()
    assert kind == {"spawned": "Popen", "forked": "Forked"}[transport]


@pytest.mark.parametrize("end", ["close", "discard"])
def test_a_tracker_s_end_closes_its_pipes(mlflow_store: tuple[str, str], end: str) -> None:
    """Closed or discarded, a worker leaves no descriptor of the stage's open (a stage
    may open several workers; a pipe left to the garbage collector warns)."""
    before = set(os.listdir("/proc/self/fd"))
    tracker = Tracker.spawn(*mlflow_store)
    assert tracker.unreachable() is None
    getattr(tracker, end)()
    assert set(os.listdir("/proc/self/fd")) == before


def _run(mlflow_store: tuple[str, str], run_id: str) -> Any:
    return MlflowClient(tracking_uri=mlflow_store[0]).get_run(run_id)


def test_a_run_is_logged_in_order_and_finished(
    mlflow_store: tuple[str, str], tmp_path: Path
) -> None:
    artifact = tmp_path / "table.csv"
    artifact.write_text("a,b\n1,2\n")
    with Tracker.spawn(*mlflow_store).run(
        "finetune@x",
        experiment="e",
        tags={"dvc_stage": "finetune@x"},
        inputs={},
        start_time=1_700_000_000_000,
    ) as run:
        run.log_params({"lr": 0.1, "nested": {"k": (1, 2)}})
        run.log_history([{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": float("nan")}])
        run.log_artifact(artifact, "plots")
        run.mark_outputs({"models/x/posterior.pt": "abc"})
    got = _run(mlflow_store, run.run_id)
    assert got.info.status == "FINISHED" and got.info.run_name == "finetune@x"
    assert got.info.start_time == 1_700_000_000_000, "the stage's start, not the worker's"
    assert got.data.params == {"lr": "0.1", "nested.k": "[1, 2]"}
    assert got.data.tags["bayesavg.output.models/x/posterior.pt"] == "abc"
    history = MlflowClient(tracking_uri=mlflow_store[0]).get_metric_history(run.run_id, "loss")
    assert [m.step for m in history] == [1, 2]
    assert list((tmp_path / "mlartifacts").rglob("table.csv"))


def test_an_exception_ends_the_run_failed(mlflow_store: tuple[str, str]) -> None:
    """... and the UI's run says why, in the line its stage ended with (``said_of``),
    before the description it had."""
    tracker = Tracker.spawn(*mlflow_store)
    with (
        pytest.raises(KeyError),
        tracker.run("s", experiment="e", tags={NOTE_TAG: "earlier note"}, inputs={}) as run,
    ):
        run_id = run.run_id
        raise KeyError("the stage's own error propagates")
    got = _run(mlflow_store, run_id)
    assert got.info.status == "FAILED"
    said = 'KeyError: "the stage\'s own error propagates"'
    assert got.data.tags[FAILURE_TAG] == said
    assert got.data.tags[NOTE_TAG] == f"Failed: {said}\n\nearlier note"


def test_a_vanished_stage_leaves_a_killed_run_that_can_be_resumed(
    mlflow_store: tuple[str, str],
) -> None:
    tracker = Tracker.spawn(*mlflow_store)
    tracker.send("start", run_name="s", experiment="e", tags={}, inputs={}, resume=None)
    assert tracker.unreachable() is None  # the first answer: the store is reachable
    run_id = tracker.receive()["run_id"]  # the worker answers a start with the run's id
    tracker.close()  # what SIGKILL does to the stage's end of the pipe
    killed = _run(mlflow_store, run_id)
    assert killed.info.status == "KILLED"
    assert killed.data.tags[FAILURE_TAG] == DIED
    with Tracker.spawn(*mlflow_store).run(
        "s", experiment="e", tags={}, inputs={}, resume=run_id
    ) as run:
        run.log_metrics({"resumed": 1.0})
    assert run.run_id == run_id
    resumed = _run(mlflow_store, run_id)
    assert resumed.info.status == "FINISHED"
    # its page no longer leads with "Killed: ..." of a run that finished; the line is kept
    assert FAILURE_TAG not in resumed.data.tags and NOTE_TAG not in resumed.data.tags
    assert resumed.data.tags[RESUMED_TAG] == f"Killed: {DIED}"


def test_one_worker_serves_runs_one_after_another(mlflow_store: tuple[str, str]) -> None:
    """A stage with several units (the predictors of one trajectory) keeps one worker:
    each run gets its own id, metrics and FINISHED status, whatever order ids are read."""
    tracker = Tracker.spawn(*mlflow_store)
    runs = []
    for name in ("evaluate@a", "evaluate@b", "evaluate@c"):
        with tracker.run(name, experiment="e", tags={}, inputs={}, close=False) as run:
            run.log_metrics({"nll": float(len(runs))})
        runs.append(run)
    tracker.close()
    ids = [r.run_id for r in runs]
    assert len(set(ids)) == 3
    for i, (run_id, name) in enumerate(
        zip(ids, ("evaluate@a", "evaluate@b", "evaluate@c"), strict=True)
    ):
        got = _run(mlflow_store, run_id)
        assert got.info.run_name == name and got.info.status == "FINISHED"
        assert got.data.metrics == {"nll": float(i)}


def test_a_run_marks_others_rolled_back_through_the_worker(
    mlflow_store: tuple[str, str],
) -> None:
    """``mark_rolled_back`` reaches the store: the runs named get the tag and a description
    saying why, the run that names them does not."""
    tracker = Tracker.spawn(*mlflow_store)
    with tracker.run("probe@a", experiment="e", tags={}, inputs={}, close=False) as first:
        pass
    with tracker.run("probe@b", experiment="e", tags={}, inputs={}) as second:
        second.mark_rolled_back({"probe@a": first.run_id}, "its outputs were removed")
    why = "its outputs were removed: the stage writes all or none"
    tags = _run(mlflow_store, first.run_id).data.tags
    assert tags[ROLLED_BACK_TAG] == why
    assert tags["mlflow.note.content"] == f"Rolled back: {why}."
    assert ROLLED_BACK_TAG not in _run(mlflow_store, second.run_id).data.tags


def test_a_stage_failing_after_its_units_is_recorded_through_the_last_one_s_run(
    mlflow_store: tuple[str, str],
) -> None:
    """A set's failure outside its units' runs (``_sets.one_set``) goes through its last
    finished unit's run, ended already: the worker still carries it out."""
    tracker = Tracker.spawn(*mlflow_store)
    with tracker.run("probe@a", experiment="e", tags={}, inputs={}, close=False) as first:
        pass
    with tracker.run("probe@b", experiment="e", tags={}, inputs={}, close=False) as second:
        pass
    units = {"probe@a": first.run_id, "probe@b": second.run_id}
    second.record_in_parent("landscape", {}, "KILLED", units, "stopped", between_units=True)
    tracker.close()
    for run_id in units.values():
        got = _run(mlflow_store, run_id)
        assert got.info.status == "FINISHED"
        assert got.data.tags[ROLLED_BACK_TAG].startswith(
            "its outputs were removed when its stage, landscape, ended KILLED"
        )


def test_the_worker_s_run_takes_what_the_stage_s_run_sends() -> None:
    """The worker calls ``Run``'s method of each op's name with the fields sent: every
    method of ``RemoteRun`` has its namesake in ``Run``, with the same parameters (one
    that forwards ``**fields`` whatever ``Run``'s takes by keyword)."""
    sent = {n: m for n, m in vars(RemoteRun).items() if callable(m) and not n.startswith("_")}
    assert "mark_rolled_back" in sent
    for name, method in sent.items():
        stage_side = inspect.signature(method).parameters
        worker_side = inspect.signature(getattr(Run, name)).parameters
        if list(stage_side) == ["self", "fields"]:
            assert all(p.kind is not p.POSITIONAL_ONLY for p in worker_side.values()), name
        else:
            assert list(stage_side) == list(worker_side), name


def test_upstream_runs_are_found_by_the_bytes_they_wrote(mlflow_store: tuple[str, str]) -> None:
    with Tracker.spawn(*mlflow_store).run("finetune@a", experiment="e", tags={}, inputs={}) as up:
        up.mark_outputs({"models/a/posterior.pt": "sha-1"})
    with Tracker.spawn(*mlflow_store).run(
        "evaluate@a", experiment="e", tags={}, inputs={"models/a/posterior.pt": "sha-1"}
    ) as down:
        pass
    with Tracker.spawn(*mlflow_store).run(
        "evaluate@b", experiment="e", tags={}, inputs={"models/a/posterior.pt": "other"}
    ) as stale:
        pass
    assert _run(mlflow_store, down.run_id).data.tags["upstream.finetune@a"] == up.run_id
    assert not any(k.startswith("upstream.") for k in _run(mlflow_store, stale.run_id).data.tags)


def test_a_broken_store_is_an_error_not_a_hang(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A store that cannot open (its "directory" is a file): the stage gets a
    TrackingError pointing at the worker's own error above, and does not wait forever."""
    (tmp_path / "a-file").write_text("not a directory")
    bad = f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}"
    tracker = Tracker.spawn(bad, (tmp_path / "artifacts").as_uri())
    with (
        pytest.raises(TrackingError, match=r"tracking worker stopped \(exit code 1\)"),
        tracker.run("s", experiment="e", tags={}, inputs={}) as run,
    ):
        _ = run.run_id
    assert "Traceback" in capfd.readouterr().err  # "above": on the stage's own stderr


def test_experiments_open_as_model_training_and_runs_name_their_source(
    mlflow_store: tuple[str, str],
) -> None:
    """The kind tag on a new experiment and on one made before it existed; MLflow's own
    source tags fill the UI's Source, User and Version columns (run.info.user_id too)."""
    from bayesavg.tracking.source import source_tags
    from bayesavg.tracking.store import EXPERIMENT_KIND, open_run

    client = MlflowClient(tracking_uri=mlflow_store[0])
    old = client.create_experiment("old", artifact_location=mlflow_store[1])
    assert "mlflow.experimentKind" not in client.get_experiment(old).tags
    tags = source_tags("stages/evaluate.py", "abc123-dirty")
    for name in ("new", "old"):
        run = open_run(
            "s",
            tracking_uri=mlflow_store[0],
            artifact_location=mlflow_store[1],
            experiment=name,
            tags=tags,
        )
        run.terminate()
        exp = client.get_experiment_by_name(name)
        assert {k: exp.tags.get(k) for k in EXPERIMENT_KIND} == EXPERIMENT_KIND
        got = client.get_run(run.run_id)
        assert got.data.tags["mlflow.source.name"] == "stages/evaluate.py"
        assert got.data.tags["mlflow.source.type"] == "LOCAL"
        assert got.data.tags["mlflow.source.git.commit"] == "abc123-dirty"
        assert got.info.user_id == tags["mlflow.user"] != ""


def test_dataset_inputs_show_name_digest_and_split(mlflow_store: tuple[str, str]) -> None:
    sha = "ab" * 32
    with Tracker.spawn(*mlflow_store).run("s", experiment="e", tags={}, inputs={}) as run:
        run.log_datasets(
            [
                {
                    "name": "mnist5k-train",
                    "digest": sha,
                    "source": "/d/train.pt",
                    "context": "train",
                },
                {"name": "mnist5k-test", "digest": sha, "source": "/d/test.pt", "context": "test"},
            ]
        )
    got = _run(mlflow_store, run.run_id).inputs.dataset_inputs
    found = {(d.dataset.name, d.dataset.digest, d.dataset.source, d.tags[0].value) for d in got}
    assert found == {
        ("mnist5k-train", sha[:36], '{"uri": "/d/train.pt"}', "train"),
        ("mnist5k-test", sha[:36], '{"uri": "/d/test.pt"}', "test"),
    }
    assert {d.tags[0].key for d in got} == {"mlflow.data.context"}


def test_metric_names_are_grouped_by_split() -> None:
    from bayesavg.tracking.mlflow_run import metric_key

    assert metric_key("train_loss") == "train/loss"
    assert metric_key("val_accuracy") == "val/accuracy"
    assert metric_key("avg_test_loss") == "avg_test/loss"
    assert metric_key("stage_compute_seconds") == "stage/compute_seconds"
    assert metric_key("test/nll") == "test/nll"
    assert metric_key("snapshots") == "snapshots"
    assert metric_key("train_") == "train_"


def _stops(pid: int, field: str) -> set[int]:
    """Which of SIGINT and SIGTERM process ``pid`` has in its /proc mask ``field``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            mask = int(line.split()[1], 16)
            return {s for s in (signal.SIGINT, signal.SIGTERM) if mask >> (s - 1) & 1}
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_the_worker_ignores_a_stop_from_its_first_instruction(
    mlflow_store: tuple[str, str],
) -> None:
    """Ctrl-C reaches the whole process group, the worker too, maybe while it still
    imports (it was a KeyboardInterrupt traceback there, and no run's end recorded):
    blocked from its start, ignored from ``main`` on, a stop never reaches it."""
    own = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    tracker = Tracker.spawn(*mlflow_store)
    pid = tracker._proc.pid
    assert _stops(pid, "SigBlk") | _stops(pid, "SigIgn") == {signal.SIGINT, signal.SIGTERM}
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == own, "the stage's mask is back"
    os.kill(pid, signal.SIGINT)
    os.kill(pid, signal.SIGTERM)
    with tracker.run("finetune@x", experiment="e", tags={}, inputs={}) as run:
        run.log_metrics({"m": 1.0})
    assert _run(mlflow_store, run.run_id).info.status == "FINISHED"
    assert tracker._proc.wait() == 0
