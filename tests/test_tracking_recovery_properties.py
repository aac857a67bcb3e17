"""Nothing lost and nothing wrongly ended, found by mutation testing of
``bayesavg.tracking``: a replay interrupted by a second outage, spools kept apart and
in order, files a spooled call names, placeholders inside mappings, the liveness test
behind orphaned runs, and the commit runs are tagged with."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from bayesavg.tracking import orphans
from bayesavg.tracking import spool as spool_module
from bayesavg.tracking.mlflow_run import ENDED_TAG, Run, store_client
from bayesavg.tracking.source import git_commit
from bayesavg.tracking.spool import Spool, pending, resolve
from bayesavg.tracking.store import open_run
from bayesavg.tracking.worker import serve

Store = tuple[str, str]


def _calls(*calls: dict[str, Any]) -> io.StringIO:
    return io.StringIO("".join(json.dumps(c) + "\n" for c in calls))


def test_a_replay_cut_short_by_a_new_outage_goes_on_where_it_stopped(
    mlflow_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The second replay sends the rest into the run the spool attached, and nothing the
    first one sent a second time; each says on stderr what it did."""
    uri, art = mlflow_store
    real = Run.log_history
    count = {"n": 0}

    def flaky(self: Run, *args: Any, **kwargs: Any) -> None:
        count["n"] += 1
        if count["n"] == 2:
            raise ConnectionError("Connection refused")
        real(self, *args, **kwargs)

    monkeypatch.setattr(Run, "log_history", flaky)
    start = {"op": "start", "run_name": "finetune@a", "experiment": "e", "tags": {}}
    calls = _calls(
        start,
        {"op": "log_metrics", "metrics": {"a": 1.0}},
        {"op": "log_metrics", "metrics": {"b": 2.0}},
        {"op": "log_params", "params": {"lr": 0.1}},
        {"op": "end", "status": "FINISHED"},
    )
    out = io.StringIO()
    assert serve(uri, art, calls, out, tmp_path / "spool") == 0
    run_id = json.loads(out.getvalue().splitlines()[1])["run_id"]
    monkeypatch.setattr(Run, "log_history", real)
    [spooled] = pending(tmp_path / "spool", uri)

    def down(self: Run, *args: Any, **kwargs: Any) -> None:
        raise ConnectionError("Connection refused")

    folder = tmp_path / "spool"
    capsys.readouterr()
    with monkeypatch.context() as again:  # the store goes down at the params
        again.setattr(Run, "log_params", down)
        again.setattr(spool_module, "check_reachable", lambda _uri: "down")
        spool_module.replay_pending(folder, uri, art)
    said = f"warning: could not replay the tracking spool in {folder} (ConnectionError: "
    assert capsys.readouterr().err.startswith(said)
    spool_module.replay_pending(folder, uri, art)  # the params and the end
    assert "tracking: replayed 2 spooled calls from 1 spool(s)\n" in capsys.readouterr().err
    assert not spooled.exists()
    client = store_client(uri)
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.data.params == {"lr": "0.1"}
    assert len(client.get_metric_history(run_id, "b")) == 1
    assert len(client.search_runs([got.info.experiment_id])) == 1


def test_spools_replay_oldest_first_and_only_into_their_own_store(tmp_path: Path) -> None:
    """A later stage's spool may resume a run an earlier one started: oldest first; a
    spool meant for another store is not sent here (each begins with its outage line)."""
    for name, uri in (
        ("20260102T000000-1.jsonl", "sqlite:///a.db"),
        ("20260101T000000-9.jsonl", "sqlite:///a.db"),
        ("20260101T120000-5.jsonl", "sqlite:///b.db"),
    ):
        (tmp_path / name).write_text(json.dumps({"op": "outage", "uri": uri}) + "\n")
    assert [p.name for p in pending(tmp_path, "sqlite:///a.db")] == [
        "20260101T000000-9.jsonl",
        "20260102T000000-1.jsonl",
    ]


def test_a_spooled_call_keeps_every_file_it_names(tmp_path: Path) -> None:
    """Two artifacts of the same name, and a model's posterior, code and BatchNorm
    images, each kept beside the spool with its own bytes (the stage may delete them, or
    a rerun replace them, before the replay)."""
    files = {}
    for name in ("a", "b", "posterior", "code", "bn"):
        (tmp_path / name).mkdir()
        files[name] = tmp_path / name / "x.txt"
        files[name].write_text(name)
    spool = Spool.open(tmp_path / "spool", "sqlite:///a.db", "down")
    spool.add(0, "log_artifact", {"path": str(files["a"])})
    spool.add(0, "log_artifact", {"path": str(files["b"])})
    model = {"posterior": str(files["posterior"]), "code": str(files["code"])}
    spool.add(0, "log_model", {**model, "bn_images": str(files["bn"])})
    for path in files.values():  # a rerun replaces its outputs (``atomic_path``)
        path.with_suffix(".new").write_text("rewritten")
        os.replace(path.with_suffix(".new"), path)
    calls = [json.loads(line) for line in spool.path.read_text().splitlines()[1:]]
    kept = [calls[0]["path"], calls[1]["path"]]
    kept += [calls[2][k] for k in ("posterior", "code", "bn_images")]
    assert [Path(p).read_text() for p in kept] == ["a", "b", "posterior", "code", "bn"]
    assert all(Path(p).is_relative_to(spool.files) for p in kept)


def test_placeholders_resolve_inside_mappings_and_lists() -> None:
    """A registered candidate (``{"swag": {"run_id": ...}}``), a rolled-back unit, a list."""
    ids = {"spooled:s.jsonl:0": "real"}
    value = {"swag": {"run_id": "spooled:s.jsonl:0"}, "l": ["spooled:s.jsonl:0", "x"]}
    assert resolve(value, ids) == {"swag": {"run_id": "real"}, "l": ["real", "x"]}


def test_bounded_retries_keep_what_the_user_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "5")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    spool_module.bound_retries()
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "5"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "10"


def test_an_https_server_is_probed_too() -> None:
    said = spool_module.check_reachable("https://127.0.0.1:9")
    assert said is not None and said.startswith("MLflow tracking server https://127.0.0.1:9")


def test_a_dead_process_is_gone_even_before_it_is_reaped() -> None:
    """A zombie (killed, its parent not yet waiting) tracks nothing any more."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    value = orphans.owner(proc.pid)
    proc.kill()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, still a zombie
    try:
        assert orphans.gone(value)
    finally:
        proc.wait()


def test_without_a_start_time_the_pid_alone_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """An owner written where start times are unknown: a pid that is no more is gone, a
    live one (another user's too: signalling it is not permitted) is not."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    here = orphans.machine()
    assert orphans.gone(f"{here}:{proc.pid}:")
    assert not orphans.gone(f"{here}:{os.getpid()}:")

    def refused(pid: int, sig: int) -> None:
        raise PermissionError(pid)

    monkeypatch.setattr(orphans.os, "kill", refused)
    assert not orphans.gone(f"{here}:{os.getpid()}:")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _running(store: Store, owner: str) -> Any:
    """A RUNNING run of experiment ``e`` owned by ``owner``."""
    run = open_run("finetune@a", tracking_uri=store[0], artifact_location=store[1], experiment="e")
    client = MlflowClient(tracking_uri=store[0])
    client.set_tag(run.run_id, orphans.OWNER_TAG, owner)
    return client.get_run(run.run_id)


def test_the_sweep_names_the_dead_pid_and_spares_look_alike_machines(
    mlflow_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The note names the pid that tracked the run; a host name with ``_`` (a wildcard to
    SQL's LIKE) does not make another machine's run look like this machine's."""
    monkeypatch.setattr(orphans, "machine", lambda: "host_a/boot")
    pid = _dead_pid()
    dead = _running(mlflow_store, f"host_a/boot:{pid}:1")
    other = _running(mlflow_store, f"hostXa/boot:{pid}:1")
    client = MlflowClient(tracking_uri=mlflow_store[0])
    ended = orphans.sweep(client, dead.info.experiment_id, mlflow_store[0])
    assert ended == [f"finetune@a ({dead.info.run_id})"]
    note = client.get_run(dead.info.run_id).data.tags[ENDED_TAG]
    assert note.startswith(f"KILLED: the process that tracked it (pid {pid}) was gone by ")
    assert client.get_run(other.info.run_id).info.status == "RUNNING"


def test_a_run_taken_over_after_the_search_is_left_running(
    mlflow_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep checks each run again under its lock: one a resuming stage owns by
    then (its owner tag is this process) is not ended."""
    found = _running(mlflow_store, f"{orphans.machine()}:{_dead_pid()}:1")
    client = MlflowClient(tracking_uri=mlflow_store[0])
    client.set_tag(found.info.run_id, orphans.OWNER_TAG, orphans.owner())  # resumed
    monkeypatch.setattr(orphans, "_orphans", lambda _client, _exp: [found])
    assert orphans.sweep(client, found.info.experiment_id, mlflow_store[0]) == []
    assert client.get_run(found.info.run_id).info.status == "RUNNING"


def test_the_commit_is_dirty_only_for_tracked_changes(tmp_path: Path) -> None:
    """An untracked file (a run's outputs) is not a change to the code; outside a
    repository the commit is ``unknown``, not an error."""
    assert git_commit(tmp_path) == "unknown"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    (tmp_path / "new.txt").write_text("untracked\n")
    assert git_commit(tmp_path) == sha.strip()
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == f"{sha.strip()}-dirty"
