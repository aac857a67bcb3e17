"""Tracking that never costs a result (issue 30): a server down when a stage starts is one
line before anything is computed; calls that fail during a stage are spooled and the
stage goes on; a replay sends them into the right runs, once; against a real
``mlflow server`` killed while a run logs."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow_server import ErrorProxy, MlflowServer, running_server, server_worker
from pipeline_repo import PYTHON, default_params, env, make_repo

from bayesavg.runtime.io import write_json
from bayesavg.tracking import spool as spool_module
from bayesavg.tracking.mlflow_run import FAILURE_TAG, PIPELINE_TAG, Run, store_client
from bayesavg.tracking.source import default_store
from bayesavg.tracking.worker import DIED, serve

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(PYTHON).parent


def _ops(*calls: dict[str, Any]) -> io.StringIO:
    return io.StringIO("".join(json.dumps(c) + "\n" for c in calls))


START = {"op": "start", "run_name": "finetune@swag", "experiment": "outage", "tags": {"k": "v"}}


def _serve(uri: str, tmp_path: Path, *calls: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    code = serve(uri, (tmp_path / "art").as_uri(), _ops(*calls), out, tmp_path / "spool")
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def _run(uri: str, run_id: str) -> Any:
    return store_client(uri).get_run(run_id)


def test_a_call_failing_mid_stage_is_spooled_and_replayed_once(
    tmp_path: Path,
    mlflow_db: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    uri = mlflow_db
    real = Run.log_history
    calls = {"n": 0}

    def flaky(self: Run, *args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the server goes away at the second metric call
            raise ConnectionError("Connection refused")
        real(self, *args, **kwargs)

    monkeypatch.setattr(Run, "log_history", flaky)
    code, answers = _serve(
        uri,
        tmp_path,
        START,
        {"op": "log_metrics", "metrics": {"a": 1.0}},
        {"op": "log_metrics", "metrics": {"b": 2.0}},
        {"op": "log_params", "params": {"lr": 0.1}},
        {"op": "end", "status": "FINISHED"},
    )
    assert code == 0 and answers[0] == {"ready": True, "error": None}
    run_id = answers[1]["run_id"]
    lines = capsys.readouterr().err.strip().splitlines()  # mlflow's own INFO lines too
    warning = [line for line in lines if line.startswith("warning:")]
    assert len(warning) == 1 and "its outputs are written, and 3 tracking calls" in warning[0]
    assert "ConnectionError: Connection refused" in warning[0]
    [spooled] = list((tmp_path / "spool").glob("*.jsonl"))
    ops = [json.loads(line)["op"] for line in spooled.read_text().splitlines()]
    assert ops == ["outage", "attach", "log_metrics", "log_params", "end"]
    before = _run(uri, run_id)
    assert before.info.status == "RUNNING" and "b" not in before.data.metrics
    monkeypatch.setattr(Run, "log_history", real)
    artifacts = (tmp_path / "art").as_uri()
    assert spool_module.replay_all(tmp_path / "spool", uri, artifacts) == (1, 3)
    after = _run(uri, run_id)
    assert after.info.status == "FINISHED"
    assert after.data.metrics == {"a": 1.0, "b": 2.0} and after.data.params == {"lr": "0.1"}
    assert not list((tmp_path / "spool").iterdir())
    assert spool_module.replay_all(tmp_path / "spool", uri, artifacts) == (0, 0)
    history = store_client(uri).get_metric_history(run_id, "b")
    assert len(history) == 1  # sent once


@pytest.mark.parametrize(
    "end",
    [
        {"op": "end", "status": "FAILED", "why": "no space left on the device"},
        {"op": "end", "status": "KILLED", "why": "interrupted by SIGTERM"},
        None,  # the stage died
    ],
    ids=["failed", "interrupted", "died"],
)
def test_a_stage_that_did_not_finish_is_not_said_to_have_written_its_outputs(
    tmp_path: Path,
    mlflow_db: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    end: Any,
) -> None:
    """The warning about kept calls says the outputs are written only when they are: a
    stage that failed (its disk full, as the store's) or died wrote none."""
    import bayesavg.tracking.store as store

    monkeypatch.setattr(store, "open_run", lambda *a, **k: (_ for _ in ()).throw(OSError("full")))
    uri = mlflow_db
    metrics = {"op": "log_metrics", "metrics": {"acc": 0.9}}
    code, _ = _serve(uri, tmp_path, START, metrics, *([end] if end else []))
    assert code == 0
    [warning] = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
    assert re.search(r"\(OSError: full\); \d tracking calls are kept in ", warning), warning
    assert "outputs are written" not in warning


def test_a_run_started_during_the_outage_is_created_by_the_replay(
    tmp_path: Path, mlflow_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bayesavg.tracking.store as store

    uri = mlflow_db
    real = store.open_run
    monkeypatch.setattr(store, "open_run", lambda *a, **k: (_ for _ in ()).throw(OSError("down")))
    code, answers = _serve(
        uri, tmp_path, START, {"op": "log_metrics", "metrics": {"acc": 0.9}}
    )  # no end: the stage died; the replay ends the run KILLED
    assert code == 0 and answers[1]["run_id"].startswith("spooled:")
    monkeypatch.setattr(store, "open_run", real)
    [spooled] = list((tmp_path / "spool").glob("*.jsonl"))
    progress = spooled.with_suffix(".progress.json")
    assert spool_module.replay(spooled, uri, (tmp_path / "art").as_uri()) == 4
    assert not spooled.exists() and not progress.exists()
    [found] = store_client(uri).search_runs(
        [store_client(uri).get_experiment_by_name("outage").experiment_id]
    )
    assert found.info.run_name == "finetune@swag" and found.data.tags["k"] == "v"
    assert found.data.metrics == {"acc": 0.9} and found.info.status == "KILLED"
    assert found.data.tags[FAILURE_TAG] == DIED, "the replayed end says why, as a live one"


def test_a_replay_gives_placeholders_their_ids_and_sends_files_the_stage_deleted(
    tmp_path: Path, mlflow_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started during the outage: its run file holds a placeholder, its artifact
    lay in a scratch folder the stage removed. The next stage resumes it by that
    placeholder: its worker replays the spool first, and the resumed run is that run."""
    import bayesavg.tracking.store as store

    uri, art = mlflow_db, (tmp_path / "art").as_uri()
    runs = tmp_path / "runs"
    real = store.open_run
    monkeypatch.setattr(store, "open_run", lambda *a, **k: (_ for _ in ()).throw(OSError("down")))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "note.txt").write_text("kept\n")
    logged = {"op": "log_artifact", "path": str(scratch / "note.txt"), "artifact_path": None}
    out = io.StringIO()
    assert (
        serve(
            uri, art, _ops(START, logged, {"op": "end", "status": "FINISHED"}), out, runs / "spool"
        )
        == 0
    )
    placeholder = json.loads(out.getvalue().splitlines()[1])["run_id"]
    assert placeholder.startswith("spooled:")
    write_json(runs / "finetune@swag.json", {"run_id": placeholder, "stage": "finetune@swag"})
    shutil.rmtree(scratch)
    monkeypatch.setattr(store, "open_run", real)
    resumed = {**START, "resume": placeholder}
    calls = _ops(
        resumed, {"op": "log_metrics", "metrics": {"acc": 0.9}}, {"op": "end", "status": "FINISHED"}
    )
    out = io.StringIO()
    assert serve(uri, art, calls, out, runs / "spool") == 0
    run_id = json.loads((runs / "finetune@swag.json").read_text())["run_id"]
    assert json.loads(out.getvalue().splitlines()[1])["run_id"] == run_id
    client = store_client(uri)
    [found] = client.search_runs([client.get_experiment_by_name("outage").experiment_id])
    assert found.info.run_id == run_id and found.data.metrics == {"acc": 0.9}
    assert [a.path for a in client.list_artifacts(run_id)] == ["note.txt"]
    assert (
        Path(client.download_artifacts(run_id, "note.txt", str(tmp_path))).read_text() == "kept\n"
    )
    assert sorted(p.name for p in (runs / "spool").iterdir()) == ["ids.json"]
    assert json.loads((runs / "spool" / "ids.json").read_text()) == {placeholder: run_id}


def test_a_call_the_store_refuses_is_kept_aside_and_the_replay_goes_on(
    tmp_path: Path,
    mlflow_db: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A spooled artifact whose file is gone by the replay: the store is reachable, so
    the call is kept in refused.jsonl with its error, and the calls after it are sent."""
    import bayesavg.tracking.store as store

    uri, art = mlflow_db, (tmp_path / "art").as_uri()
    real = store.open_run
    monkeypatch.setattr(store, "open_run", lambda *a, **k: (_ for _ in ()).throw(OSError("down")))
    missing = {"op": "log_artifact", "path": str(tmp_path / "gone.txt"), "artifact_path": None}
    after = {"op": "log_metrics", "metrics": {"acc": 0.9}}
    end = {"op": "end", "status": "FINISHED"}
    assert _serve(uri, tmp_path, START, missing, after, end)[0] == 0
    monkeypatch.setattr(store, "open_run", real)
    [spooled] = list((tmp_path / "spool").glob("*.jsonl"))
    assert spool_module.replay(spooled, uri, art) == 4
    [refused] = map(json.loads, (tmp_path / "spool" / "refused.jsonl").read_text().splitlines())
    assert refused["call"]["op"] == "log_artifact" and "gone.txt" in refused["error"]
    assert "refused a spooled log_artifact" in capsys.readouterr().err
    client = store_client(uri)
    [found] = client.search_runs([client.get_experiment_by_name("outage").experiment_id])
    assert found.data.metrics == {"acc": 0.9} and found.info.status == "FINISHED"
    assert not spooled.exists()


def test_an_execution_ends_with_the_status_of_its_stages(tmp_path: Path, mlflow_db: str) -> None:
    """Three stages of one execution: the first finishes, the second dies (its worker's
    stdin closes before the run ends), the third finishes: the parent run ends KILLED
    and its summary says which stage did not finish."""
    uri = mlflow_db
    parent = {"key": "host:1:2:", "name": "dvc repro 2026-11-27"}

    def stage(name: str, *, dies: bool = False) -> str:
        start = {**START, "run_name": name, "parent": parent}
        done = {"op": "record_in_parent", "stage": name, "reused": {}, "status": "FINISHED"}
        calls = [start, {"op": "log_metrics", "metrics": {"m": 1.0}}]
        calls += [] if dies else [done, {"op": "end", "status": "FINISHED"}]
        code, answers = _serve(uri, tmp_path, *calls)
        assert code == 0
        return str(answers[1]["run_id"])

    client = store_client(uri)

    def parent_run() -> Any:
        exp = client.get_experiment_by_name("outage")
        return client.search_runs([exp.experiment_id], "tags.`bayesavg.execution` != ''")[0]

    stage("finetune@sgd")
    assert parent_run().info.status == "FINISHED"
    died = stage("evaluate@sgd", dies=True)
    assert client.get_run(died).info.status == "KILLED"
    assert parent_run().info.status == "KILLED"
    stage("evaluate@swag")
    found = parent_run()
    assert found.info.status == "KILLED"
    summary = json.loads(found.data.tags[PIPELINE_TAG])
    assert summary["failed"] == {"evaluate@sgd": "KILLED"} and len(summary["ran"]) == 3
    assert summary["why"] == {"evaluate@sgd": DIED}
    said = f"Did not finish: evaluate@sgd (KILLED: {DIED})."
    assert said in found.data.tags["mlflow.note.content"]


def test_a_servers_experiments_keep_their_artifacts_on_the_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.team.example")
    assert default_store(tmp_path) == ("https://mlflow.team.example", "")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert default_store(tmp_path)[1] == (tmp_path / "mlartifacts").resolve().as_uri()


def test_an_unreachable_server_is_one_line_within_seconds() -> None:
    started = time.perf_counter()
    found = spool_module.check_reachable("http://127.0.0.1:9")
    assert time.perf_counter() - started < 15
    assert found is not None and "\n" not in found
    assert "http://127.0.0.1:9" in found and "Connection refused" in found
    assert "MLFLOW_TRACKING_URI" in found
    assert spool_module.check_reachable("sqlite:///x.db") is None


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_are_one_line_naming_the_token(status: int) -> None:
    proxy = ErrorProxy(None, status=status)
    try:
        found = spool_module.check_reachable(proxy.uri)
    finally:
        proxy.close()
    assert found is not None and "\n" not in found and proxy.uri in found
    assert f"refused the credentials (HTTP {status})" in found
    assert "MLFLOW_TRACKING_TOKEN" in found and proxy.failed == 1  # asked once: no retry


def test_an_unknown_host_is_one_line_within_seconds() -> None:
    started = time.perf_counter()
    found = spool_module.check_reachable("http://tracking.invalid:5000")
    assert time.perf_counter() - started < 15
    assert found is not None and "\n" not in found
    assert "http://tracking.invalid:5000 is unreachable (" in found
    assert "Connection refused" not in found  # the resolver's own words


def test_a_stage_stops_before_computing_when_the_server_is_down(tmp_path: Path) -> None:
    """The data stage with MLFLOW_TRACKING_URI at a closed port: exit 2, one line naming
    the URI and the cause, no output, well within 15 seconds."""
    (tmp_path / "repo").mkdir()
    repo = make_repo(tmp_path / "repo", default_params())
    environ = env(MLFLOW_TRACKING_URI="http://127.0.0.1:9")
    started = time.perf_counter()
    proc = subprocess.run(
        [PYTHON, "stages/data.py"], cwd=repo, env=environ, capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "http://127.0.0.1:9 is unreachable" in lines[0], lines
    assert "Connection refused" in lines[0]
    assert not (repo / "data" / "prepared" / "manifest.json").exists()
    assert seconds < 15


def _stderr(proc: subprocess.Popen[str]) -> str:
    """What the worker wrote to its stderr, the pipe closed after."""
    assert proc.stderr is not None
    with proc.stderr:
        return proc.stderr.read()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One server for the module (a start takes seconds); a test that kills it starts it
    again on the same port and store."""
    with running_server(tmp_path_factory.mktemp("server")) as found:
        yield found


@pytest.mark.slow  # a real server killed and restarted (~22 s on 2 cores)
def test_a_real_server_killed_mid_run_loses_nothing(server: MlflowServer, tmp_path: Path) -> None:
    """Over HTTP: a run logs, the server is killed, the worker spools the rest and exits
    0; the server comes back and ``bayesavg track --sync`` completes the run, once."""
    uri = server.uri
    root = tmp_path / "project"
    (root / "runs").mkdir(parents=True)
    environ = env(MLFLOW_TRACKING_URI=uri)
    tracker, proc = server_worker(uri, root / "runs" / "spool")
    (root / "before.txt").write_text("logged before the outage\n")
    (root / "after.txt").write_text("logged during it\n")
    with tracker.run("finetune@swag", experiment="team", tags={}, inputs={}) as run:
        run.log_metrics({"epoch_loss": 1.0}, step=1)
        run.log_artifact(root / "before.txt")
        run_id = run.run_id  # the server answered: the run exists there
        deadline = time.time() + 30  # the worker sends in order, behind the stage
        while not store_client(uri).list_artifacts(run_id):
            assert time.time() < deadline, "the first artifact never reached the server"
            time.sleep(0.2)
        server.kill()
        run.log_metrics({"epoch_loss": 0.5}, step=2)
        run.log_params({"lr": 0.05})
        run.log_artifact(root / "after.txt")
    stderr = _stderr(proc)
    assert proc.returncode == 0
    assert "tracking calls are kept in" in stderr and "bayesavg track --sync" in stderr
    server.start()
    cli = [str(BIN / "bayesavg"), "track", "--sync", "--root", str(root)]
    done = subprocess.run(cli, env=environ, capture_output=True, text=True)
    assert done.returncode == 0 and "sent 4 spooled calls" in done.stdout, done.stderr
    again = subprocess.run(cli, env=environ, capture_output=True, text=True)
    assert "nothing spooled" in again.stdout
    client = store_client(uri)
    found = client.get_run(run_id)
    assert found.info.status == "FINISHED" and found.data.params == {"lr": "0.05"}
    history = client.get_metric_history(run_id, "epoch_loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 0.5)]
    assert sorted(a.path for a in client.list_artifacts(run_id)) == ["after.txt", "before.txt"]
    stored = sorted(p.name for p in server.artifacts.rglob("*.txt"))
    assert stored == ["after.txt", "before.txt"]  # in the server's store, not the client's
    assert not (root / "mlartifacts").exists()


def test_a_server_answering_errors_mid_run_loses_nothing(
    server: MlflowServer, tmp_path: Path
) -> None:
    """Behind a proxy whose backend starts answering 503 while a run logs: the worker
    gives up after its bounded retries, spools the rest and exits 0; once the errors
    stop, ``bayesavg track --sync`` completes the run, once."""
    proxy = ErrorProxy(server)
    try:
        root = tmp_path / "project"
        (root / "runs").mkdir(parents=True)
        environ = env(MLFLOW_TRACKING_URI=proxy.uri)
        tracker, proc = server_worker(proxy.uri, root / "runs" / "spool")
        with tracker.run("finetune@swag", experiment="team", tags={}, inputs={}) as run:
            run.log_metrics({"epoch_loss": 1.0}, step=1)
            run_id = run.run_id
            deadline = time.time() + 30
            while not store_client(server.uri).get_run(run_id).data.metrics:
                assert time.time() < deadline, "the first metric never reached the server"
                time.sleep(0.2)
            proxy.fail()
            started = time.perf_counter()
            run.log_metrics({"epoch_loss": 0.5}, step=2)
            run.log_params({"lr": 0.05})
        seconds = time.perf_counter() - started
        stderr = _stderr(proc)
        assert proc.returncode == 0 and proxy.failed >= 1
        assert "tracking calls are kept in" in stderr and "503" in stderr, stderr
        assert seconds < 60  # bounded retries, stated in the README
        proxy.heal()
        cli = [str(BIN / "bayesavg"), "track", "--sync", "--root", str(root)]
        done = subprocess.run(cli, env=environ, capture_output=True, text=True)
        assert done.returncode == 0 and "sent 3 spooled calls" in done.stdout, done.stderr
        found = store_client(server.uri).get_run(run_id)
        assert found.info.status == "FINISHED" and found.data.params == {"lr": "0.05"}
        history = store_client(server.uri).get_metric_history(run_id, "epoch_loss")
        assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 0.5)]
    finally:
        proxy.close()
