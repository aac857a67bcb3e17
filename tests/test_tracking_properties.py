"""What the MLflow UI shows of runs, executions and the registry, found by mutation testing
of ``bayesavg.tracking``: exact parent notes and statuses, limits that must not lose a
value, resumed and upstream runs, and the registered champion. In-process, SQLite stores."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from mlflow.entities import LoggedModelOutput
from mlflow.tracking import MlflowClient

from bayesavg.tracking.mlflow_run import (
    ENDED_TAG,
    NOTE_TAG,
    PARENT_TAG,
    PIPELINE_TAG,
    ROLLED_BACK_TAG,
    Run,
)
from bayesavg.tracking.serialized import serialized
from bayesavg.tracking.store import RESUMED_TAG, open_run
from bayesavg.tracking.worker import DIED

Store = tuple[str, str]
EXECUTION = {"key": "host:1:2:", "name": "dvc repro now"}


def _open(store: Store, name: str, **kwargs: Any) -> Run:
    return open_run(
        name, tracking_uri=store[0], artifact_location=store[1], experiment="e", **kwargs
    )


def _stage(store: Store, name: str, **kwargs: Any) -> Run:
    """A stage's run in the execution ``EXECUTION``."""
    return _open(store, name, parent=EXECUTION, **kwargs)


def _client(store: Store) -> MlflowClient:
    return MlflowClient(tracking_uri=store[0])


def _parent(store: Store, run: Run) -> Any:
    client = _client(store)
    return client.get_run(client.get_run(run.run_id).data.tags[PARENT_TAG])


def test_the_parent_s_note_says_what_ran_failed_and_was_reused(mlflow_store: Store) -> None:
    """The parent's description, as the UI shows it: stages that ran, those that did not
    finish (with why where one was given, none invented), the reused ones sorted with
    their runs and never a stage that ran here; a later stage's ``None`` keeps them."""
    first = _stage(mlflow_store, "finetune@a")
    reused = {"pretrain": "r1", "prepare": "r0", "finetune@a": "r-old"}
    first.record_in_parent("finetune@a", reused, "FINISHED")
    _stage(mlflow_store, "evaluate@a").record_in_parent("evaluate@a", None, "FAILED")
    last = _stage(mlflow_store, "evaluate@b")
    last.record_in_parent("evaluate@b", None, "KILLED", why="interrupted by SIGTERM")
    parent = _parent(mlflow_store, last)
    note = parent.data.tags[NOTE_TAG]
    assert note == (
        "Ran 3 stage(s): finetune@a, evaluate@a, evaluate@b. "
        "Did not finish: evaluate@a (FAILED); evaluate@b (KILLED: interrupted by SIGTERM). "
        "Reused 2 stage(s) DVC skipped; their outputs come from: prepare (run r0); "
        "pretrain (run r1)."
    )
    summary = json.loads(parent.data.tags[PIPELINE_TAG])
    assert summary["reused"] == {"prepare": "r0", "pretrain": "r1"}
    assert summary["why"] == {"evaluate@b": "interrupted by SIGTERM"}
    assert summary["failed"] == {"evaluate@a": "FAILED", "evaluate@b": "KILLED"}


def test_the_execution_keeps_the_status_of_its_first_stage_that_did_not_finish(
    mlflow_store: Store,
) -> None:
    """README: FAILED or KILLED, the first other status a stage ended with, whatever the
    stages' names and however many finish after (not the alphabetically first)."""
    order = [("finetune@z", "FAILED"), ("evaluate@a", "KILLED"), ("report", "FINISHED")]
    for name, status in order:
        run = _stage(mlflow_store, name)
        run.record_in_parent(name, {}, status)
        assert _parent(mlflow_store, run).info.status == "FAILED", name


def test_a_stage_s_first_reason_is_kept_when_its_worker_records_it_again(
    mlflow_store: Store,
) -> None:
    """A stage that recorded its failure and was then killed before ending its run: its
    worker records it KILLED (``DIED``) after; the parent keeps the stage's own reason."""
    run = _stage(mlflow_store, "finetune@a")
    run.record_in_parent("finetune@a", {}, "FAILED", why="no space left on the device")
    run.record_in_parent("finetune@a", None, "KILLED", why=DIED)
    parent = _parent(mlflow_store, run)
    summary = json.loads(parent.data.tags[PIPELINE_TAG])
    assert summary["failed"] == {"finetune@a": "FAILED"} and parent.info.status == "FAILED"
    assert summary["why"] == {"finetune@a": "no space left on the device"}


def test_a_late_end_of_a_stage_drops_the_sweep_s_note_on_its_parent(
    mlflow_store: Store,
) -> None:
    """A parent ended KILLED by a sweep (``ENDED_TAG``) whose stage's own record arrives
    later (a replayed spool) is no longer said to be orphaned."""
    run = _stage(mlflow_store, "finetune@a")
    parent_id = _parent(mlflow_store, run).info.run_id
    _client(mlflow_store).set_tag(parent_id, ENDED_TAG, "KILLED: swept")
    run.record_in_parent("finetune@a", {}, "FINISHED")
    parent = _client(mlflow_store).get_run(parent_id)
    assert parent.info.status == "FINISHED" and ENDED_TAG not in parent.data.tags


def test_rolled_back_runs_are_marked_without_a_parent_too(mlflow_store: Store) -> None:
    """A direct run (no execution): the runs whose outputs went are still tagged."""
    done = _open(mlflow_store, "evaluate@map")
    done.terminate()
    failing = _open(mlflow_store, "evaluate@swag")
    failing.record_in_parent("evaluate@swag", {}, "FAILED", {"evaluate@map": done.run_id})
    tags = _client(mlflow_store).get_run(done.run_id).data.tags
    assert tags[ROLLED_BACK_TAG] == (
        "its outputs were removed when evaluate@swag, of the same stage, ended FAILED: "
        "the stage writes all or none"
    )


def test_the_parent_names_every_rolled_back_unit_of_the_execution(
    mlflow_store: Store,
) -> None:
    """Two stages each lose a unit's outputs: the parent's summary keeps both."""
    done = {}
    for name in ("evaluate@a", "landscape@a"):
        unit = _stage(mlflow_store, name)
        unit.record_in_parent(name, {}, "FINISHED")
        done[name] = unit.run_id
    for stage, unit in (("evaluate@b", "evaluate@a"), ("landscape@b", "landscape@a")):
        failing = _stage(mlflow_store, stage)
        failing.record_in_parent(stage, {}, "FAILED", {unit: done[unit]})
    summary = json.loads(_parent(mlflow_store, failing).data.tags[PIPELINE_TAG])
    assert summary["rolled_back"] == ["evaluate@a", "landscape@a"]


def test_no_param_or_metric_is_lost_past_a_batch_or_a_type(
    mlflow_store: Store, tmp_path: Path
) -> None:
    """150 params (log_batch takes 100), 1001 metric points (it takes 1000), integer
    metrics, a param value cut at MLflow's 6000 characters exactly, a folder artifact."""
    run = _open(mlflow_store, "s")
    run.log_params({**{f"p{i:03d}": i for i in range(150)}, "long": "x" * 7000})
    run.log_history([{"epoch": i, "loss": 0.5} for i in range(1001)])
    run.log_metrics({"count": 3})
    folder = tmp_path / "plots"
    folder.mkdir()
    (folder / "a.csv").write_text("1\n")
    run.log_artifact(folder, "tables")
    client = _client(mlflow_store)
    got = client.get_run(run.run_id).data
    assert len(got.params) == 151 and got.params["p149"] == "149"
    assert got.params["long"] == "x" * 6000
    assert len(client.get_metric_history(run.run_id, "loss")) == 1001
    assert got.metrics["count"] == 3.0
    assert [a.path for a in client.list_artifacts(run.run_id, "tables")] == ["tables/a.csv"]


def test_upstream_names_the_newest_run_that_wrote_the_bytes(mlflow_store: Store) -> None:
    old = _open(mlflow_store, "finetune@a", start_time=1_000)
    old.mark_outputs({"models/a/posterior.pt": "sha"})
    new = _open(mlflow_store, "finetune@a", start_time=2_000)
    new.mark_outputs({"models/a/posterior.pt": "sha"})
    reader = _open(mlflow_store, "evaluate@a", inputs={"models/a/posterior.pt": "sha"})
    tags = _client(mlflow_store).get_run(reader.run_id).data.tags
    assert tags["upstream.finetune@a"] == new.run_id


def test_the_parent_carries_the_stage_s_source_and_the_execution_s_own_tags(
    mlflow_store: Store,
) -> None:
    """The UI's Source, User and Version columns on the parent row too, and what the
    execution adds beside its key and name (the DVC experiment)."""
    source = {"mlflow.source.name": "stages/finetune.py", "mlflow.user": "me", "other": "x"}
    parent = {**EXECUTION, "DVC_EXP_NAME": "exp-1"}
    run = _open(mlflow_store, "finetune@a", parent=parent, tags=source)
    tags = _parent(mlflow_store, run).data.tags
    assert tags["mlflow.source.name"] == "stages/finetune.py" and tags["mlflow.user"] == "me"
    assert tags["DVC_EXP_NAME"] == "exp-1" and "other" not in tags


def test_a_resumed_run_moves_to_the_execution_that_resumed_it(mlflow_store: Store) -> None:
    first = _open(mlflow_store, "finetune@a", parent={"key": "exec-1", "name": "one"})
    first.terminate("KILLED", "interrupted")
    again = _open(
        mlflow_store, "finetune@a", parent={"key": "exec-2", "name": "two"}, resume=first.run_id
    )
    assert again.run_id == first.run_id
    assert _parent(mlflow_store, again).info.run_name == "two"


@pytest.mark.parametrize("why", ["deleted", "another experiment"])
def test_a_run_that_cannot_be_resumed_gives_a_new_one(mlflow_store: Store, why: str) -> None:
    """A deleted run, or one of another experiment, is not reopened."""
    if why == "deleted":
        gone = _open(mlflow_store, "finetune@a")
        gone.terminate("KILLED", "interrupted")
        _client(mlflow_store).delete_run(gone.run_id)
    else:
        uri, artifacts = mlflow_store
        gone = open_run("finetune@a", tracking_uri=uri, artifact_location=artifacts, experiment="x")
        gone.terminate("KILLED", "interrupted")
    again = _open(mlflow_store, "finetune@a", resume=gone.run_id)
    assert again.run_id != gone.run_id
    assert _client(mlflow_store).get_run(again.run_id).info.status == "RUNNING"


def _logged_model(client: MlflowClient, run: Run) -> str:
    """A READY logged model, output of ``run`` (what ``Run.log_model`` leaves)."""
    exp_id = client.get_run(run.run_id).info.experiment_id
    model = client.create_logged_model(exp_id, name="m", source_run_id=run.run_id)
    client.finalize_logged_model(model.model_id, "READY")
    client.log_outputs(run.run_id, [LoggedModelOutput(model.model_id, 0)])
    return str(model.model_id)


def test_the_champion_is_the_lowest_validation_nll_and_its_latest_model(
    mlflow_store: Store,
) -> None:
    """A version per new best model, none for the same one again;
    alias ``champion``; the predictor as a tag; every candidate in the description, best
    first; the report's run tagged with what it registered."""
    client = _client(mlflow_store)
    runs = {p: _open(mlflow_store, f"evaluate@{p}") for p in ("swag", "sgd", "map")}
    models = {p: _logged_model(client, r) for p, r in runs.items()}
    candidates = {
        p: {"run_id": runs[p].run_id, "val_nll": v}
        for p, v in (("swag", 0.2), ("sgd", 0.1), ("map", 0.3))
    }
    report = _open(mlflow_store, "report")

    def register() -> str:
        report.register_best("bayesavg-test", candidates)
        tag = client.get_run(report.run_id).data.tags["registered_model"]
        champion = client.get_model_version_by_alias("bayesavg-test", "champion")
        assert tag == f"models:/bayesavg-test/{champion.version}"
        assert champion.tags["predictor"] == "sgd"
        return str(champion.version)

    assert register() == "1"
    assert register() == "1", "the same best model: no new version"
    runs["sgd"] = _open(mlflow_store, "evaluate@sgd")  # a forced rerun: a new run and model
    models["sgd"] = _logged_model(client, runs["sgd"])
    candidates["sgd"]["run_id"] = runs["sgd"].run_id
    assert register() == "2"
    assert register() == "2"
    version = client.get_model_version("bayesavg-test", "2")
    assert version.source == f"models:/{models['sgd']}"
    assert client.get_registered_model("bayesavg-test").description == (
        "Best by validation NLL first. Candidates:\n"
        f"sgd: models:/{models['sgd']} (validation NLL 0.1000)\n"
        f"swag: models:/{models['swag']} (validation NLL 0.2000)\n"
        f"map: models:/{models['map']} (validation NLL 0.3000)"
    )


def test_identical_bytes_are_stored_once_and_every_run_says_where(
    mlflow_store: Store, tmp_path: Path
) -> None:
    """A forced rerun's identical posterior adds nothing to the artifact store; both runs
    carry ``stored_at``, the ``runs:/`` URI of the one copy."""
    posterior = tmp_path / "posterior.pt"
    posterior.write_bytes(b"weights")
    first, second = _open(mlflow_store, "finetune@a"), _open(mlflow_store, "finetune@a")
    uri = f"runs:/{first.run_id}/posterior/posterior.pt"
    assert first.log_artifact_once(posterior, "posterior", "sha") == uri
    assert second.log_artifact_once(posterior, "posterior", "sha") == uri
    client = _client(mlflow_store)
    for run in (first, second):
        assert client.get_run(run.run_id).data.tags["stored_at"] == uri
    assert client.list_artifacts(second.run_id) == []


def test_a_stage_s_record_waits_while_another_holds_the_parent(
    mlflow_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Side by side, each stage rewrites the parent's summary whole: one must not read it
    while another stage (here, this thread) holds the parent's lock, or a stage is lost."""
    first, second = _stage(mlflow_store, "finetune@a"), _stage(mlflow_store, "finetune@b")
    parent_id = _parent(mlflow_store, first).info.run_id
    entered = threading.Event()
    real = Run._record

    def record(self: Run, *args: Any) -> None:
        entered.set()
        real(self, *args)

    monkeypatch.setattr(Run, "_record", record)
    waiting = threading.Thread(target=second.record_in_parent, args=("finetune@b", {}, "FINISHED"))
    with serialized(mlflow_store[0], parent_id):
        waiting.start()
        assert not entered.wait(2), "read the parent's summary under another's lock"
        ran = {"ran": {"finetune@a": first.run_id}, "reused": {}}
        _client(mlflow_store).set_tag(parent_id, PIPELINE_TAG, json.dumps(ran))
    waiting.join(timeout=60)
    summary = json.loads(_parent(mlflow_store, first).data.tags[PIPELINE_TAG])
    assert summary["ran"] == {"finetune@a": first.run_id, "finetune@b": second.run_id}


def test_a_resumed_run_no_longer_says_how_it_ended_before(mlflow_store: Store) -> None:
    """Rolled back (its pretrain set's init failed), then resumed from its checkpoint: the
    page's top line and the tag go, the user's own words stay, ``RESUMED_TAG`` keeps what
    it said. A run the sweep ended KILLED likewise loses the sweep's note."""
    client = MlflowClient(tracking_uri=mlflow_store[0])
    first = _open(mlflow_store, "pretrain")
    client.set_tag(first.run_id, NOTE_TAG, "a user's own words")
    first.terminate()
    _open(mlflow_store, "init").mark_rolled_back({"pretrain": first.run_id}, "init failed")
    said = "Rolled back: init failed: the stage writes all or none."
    assert client.get_run(first.run_id).data.tags[NOTE_TAG].startswith(said)
    _open(mlflow_store, "pretrain", resume=first.run_id).terminate()
    tags = client.get_run(first.run_id).data.tags
    assert ROLLED_BACK_TAG not in tags and tags[NOTE_TAG] == "a user's own words"
    assert tags[RESUMED_TAG] == said
    swept = _open(mlflow_store, "finetune@swag")
    client.set_tag(swept.run_id, ENDED_TAG, "KILLED: the process that tracked it ...")
    client.set_terminated(swept.run_id, status="KILLED")
    _open(mlflow_store, "finetune@swag", resume=swept.run_id)
    tags = client.get_run(swept.run_id).data.tags
    assert ENDED_TAG not in tags and NOTE_TAG not in tags
    assert tags[RESUMED_TAG] == "KILLED: the process that tracked it ..."
