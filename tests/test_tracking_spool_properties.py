"""The spool's promises found untested by mutation of ``bayesavg.tracking.spool``: the
retry bounds the README states, the start-of-stage probe (two tries, the token sent),
files kept across file systems and whole folders, a replay cut short after it created
a run, placeholders apart per run, and spool folders a replay cannot read."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from mlflow_server import ErrorProxy
from test_tracking_outage import START, _serve

import bayesavg.tracking.store as store
from bayesavg.tracking import spool as spool_module
from bayesavg.tracking.mlflow_run import Run, store_client
from bayesavg.tracking.spool import Spool, pending, replay, replay_pending


def _down(*_args: Any, **_kwargs: Any) -> None:
    raise ConnectionError("Connection refused")


def _outage_at_start(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The store fails every ``open_run`` (the stage's runs start during the outage);
    returns the real one."""
    real = store.open_run
    monkeypatch.setattr(store, "open_run", _down)
    return real


def test_retries_are_bounded_as_the_readme_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 retries, backoff factor 1, 10 s per request, where the user set none."""
    for key in spool_module.RETRIES:
        monkeypatch.delenv(key, raising=False)
    spool_module.bound_retries()
    assert [os.environ[f"MLFLOW_HTTP_REQUEST_{k}"] for k in ("MAX_RETRIES", "BACKOFF_FACTOR")] == [
        "2",
        "1",
    ]
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "10"


def test_a_server_answering_errors_at_the_start_is_tried_twice_then_named() -> None:
    proxy = ErrorProxy(None, status=503)
    try:
        found = spool_module.check_reachable(proxy.uri)
    finally:
        proxy.close()
    assert proxy.failed == 2
    assert found is not None and "\n" not in found
    assert f"{proxy.uri} is unreachable (HTTP 503 " in found


@pytest.mark.parametrize("token", ["s3cret", None])
def test_the_probe_sends_the_tracking_token(
    monkeypatch: pytest.MonkeyPatch, token: str | None
) -> None:
    """A server behind authentication would refuse a probe without the user's token."""
    if token is None:
        monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", token)
    proxy = ErrorProxy(None, status=401)
    try:
        spool_module.check_reachable(proxy.uri)
    finally:
        proxy.close()
    [seen] = proxy.headers
    assert seen.get("Authorization") == (f"Bearer {token}" if token else None)


def test_a_spooled_folder_is_kept_whole(tmp_path: Path) -> None:
    """A folder artifact (``log_artifact`` of a directory) is kept with its files, as
    they were when the call was spooled."""
    folder = tmp_path / "plots"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.csv").write_text("a\n")
    (folder / "sub" / "b.csv").write_text("b\n")
    spool = Spool.open(tmp_path / "spool", "sqlite:///a.db", "down")
    spool.add(0, "log_artifact", {"path": str(folder), "artifact_path": "plots"})
    shutil.rmtree(folder)
    kept = Path(json.loads(spool.path.read_text().splitlines()[1])["path"])
    assert kept.is_relative_to(spool.files)
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*.csv")) == [
        "a.csv",
        "sub/b.csv",
    ]
    assert (kept / "sub" / "b.csv").read_text() == "b\n"


def test_a_file_on_another_file_system_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No hard link across file systems (EXDEV): the spool keeps a copy instead."""

    def cross_device(src: str, dst: str) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(spool_module.os, "link", cross_device)
    (tmp_path / "table.csv").write_text("before\n")
    spool = Spool.open(tmp_path / "spool", "sqlite:///a.db", "down")
    spool.add(0, "log_artifact", {"path": str(tmp_path / "table.csv")})
    (tmp_path / "table.csv").write_text("rewritten\n")
    kept = Path(json.loads(spool.path.read_text().splitlines()[1])["path"])
    assert kept.is_relative_to(spool.files) and kept.read_text() == "before\n"


def test_a_replay_cut_short_after_creating_a_run_goes_on_in_that_run(
    tmp_path: Path, mlflow_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started during the outage: the first replay creates it and sends a metric,
    then the store goes down again; the second sends the rest into the same run, with
    nothing refused and no second run."""
    uri, art = mlflow_db, (tmp_path / "art").as_uri()
    real = _outage_at_start(monkeypatch)
    metrics = {"op": "log_metrics", "metrics": {"acc": 0.9}}
    params = {"op": "log_params", "params": {"lr": 0.1}}
    assert (
        _serve(uri, tmp_path, START, metrics, params, {"op": "end", "status": "FINISHED"})[0] == 0
    )
    monkeypatch.setattr(store, "open_run", real)
    [spooled] = pending(tmp_path / "spool", uri)
    with monkeypatch.context() as again:
        again.setattr(Run, "log_params", _down)
        again.setattr(spool_module, "check_reachable", lambda _uri: "down")
        with pytest.raises(ConnectionError):
            replay(spooled, uri, art)
    assert replay(spooled, uri, art) == 2  # the params and the end
    client = store_client(uri)
    [found] = client.search_runs([client.get_experiment_by_name("outage").experiment_id])
    assert found.info.status == "FINISHED" and found.data.params == {"lr": "0.1"}
    assert found.data.metrics == {"acc": 0.9}
    assert not (tmp_path / "spool" / "refused.jsonl").exists()


def test_runs_started_in_one_outage_keep_their_own_placeholders(
    tmp_path: Path, mlflow_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one worker (two predictors) started during the outage: two
    placeholders, each replayed into its own run."""
    uri, art = mlflow_db, (tmp_path / "art").as_uri()
    real = _outage_at_start(monkeypatch)
    calls = []
    for name in ("evaluate@a", "evaluate@b"):
        calls += [{**START, "run_name": name}, {"op": "log_metrics", "metrics": {name[-1]: 1.0}}]
        calls += [{"op": "end", "status": "FINISHED"}]
    code, answers = _serve(uri, tmp_path, *calls)
    assert code == 0
    first, second = (a["run_id"] for a in answers[1:])
    assert first != second
    monkeypatch.setattr(store, "open_run", real)
    replay_pending(tmp_path / "spool", uri, art)
    ids = json.loads((tmp_path / "spool" / "ids.json").read_text())
    client = store_client(uri)
    got = {
        name: client.get_run(ids[p]) for name, p in (("evaluate@a", first), ("evaluate@b", second))
    }
    assert {k: (r.info.run_name, list(r.data.metrics)) for k, r in got.items()} == {
        "evaluate@a": ("evaluate@a", ["a"]),
        "evaluate@b": ("evaluate@b", ["b"]),
    }


def test_a_spool_cut_before_its_first_line_is_passed_over(tmp_path: Path) -> None:
    """A spool whose outage line never reached the disk (the worker killed as it opened
    it) names no store: the others are still found."""
    (tmp_path / "20260101T000000-1.jsonl").write_text("")
    (tmp_path / "20260101T000001-2.jsonl").write_text('{"op": "outa')
    good = tmp_path / "20260102T000000-3.jsonl"
    good.write_text(json.dumps({"op": "outage", "uri": "sqlite:///a.db"}) + "\n")
    assert pending(tmp_path, "sqlite:///a.db") == [good]


def test_a_stage_with_nothing_spooled_says_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every stage replays at its start: with nothing pending its output stays clean."""
    (tmp_path / "spool").mkdir()
    replay_pending(tmp_path / "spool", f"sqlite:///{tmp_path / 'mlflow.db'}", "")
    replay_pending(tmp_path / "absent", f"sqlite:///{tmp_path / 'mlflow.db'}", "")
    assert capsys.readouterr().err == ""
