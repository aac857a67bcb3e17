"""The pipeline against a team's tracking server over HTTP (issue 30): the same tree of
runs as with the embedded SQLite store, even when the server fails in the middle of a
stage and the next stage replays what it could not send."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlflow_server import ErrorProxy, running_server
from pipeline_repo import BIN, DVC, ROOT, env, make_repo, prune_landscape, sh, small_params

from bayesavg.tracking.mlflow_run import store_client

# Two executions: the first ends with evaluate@sgd, whose runs the server fails to take
# (from the creation of its first run on); the second runs the stages left, up to the
# report, which registers the best model. Its first stage replays the first's spool.
FIRST, SECOND = "evaluate@sgd", "report"
CHECK_UI = ROOT / "scripts" / "check_ui.py"


def _params() -> dict[str, Any]:
    raw = small_params(epochs=1, pretrain_epochs=1, members=1)
    raw["device"] = "cpu"
    # dswag: what the sweep stage reads (it sweeps no W here)
    raw["finetune"] = {k: raw["finetune"][k] for k in ("sgd", "dswag")}
    raw["evaluate"]["predictors"] = {"sgd": raw["evaluate"]["predictors"]["sgd"]}
    raw["evaluate"]["plane"]["trajectories"] = []
    raw["evaluate"]["dswag_sweep"]["workers"] = []
    raw["evaluate"]["ood"]["sets"] = []
    return prune_landscape(raw)


def _creates_a_run_of(stage: str) -> Callable[[str, str, bytes], bool]:
    """Whether a request creates a run of DVC stage ``stage`` (MLflow's REST runs/create)."""

    def test(_method: str, path: str, body: bytes) -> bool:
        if not path.endswith("/runs/create"):
            return False
        tags = {t["key"]: t["value"] for t in json.loads(body).get("tags", [])}
        return tags.get("dvc_stage") == stage

    return test


def _artifacts(client: Any, run_id: str, path: str | None = None) -> list[str]:
    found = []
    for item in client.list_artifacts(run_id, path):
        found += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return found


def tree(uri: str, experiment: str = "bayesavg") -> dict[str, Any]:
    """Everything a user compares runs by, without ids and times: per run name its
    parent's name, status, params, metric names, tags' names, dataset inputs, artifacts
    and logged models."""
    client = store_client(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    top = sorted(
        (r for r in runs if "mlflow.parentRunId" not in r.data.tags),
        key=lambda r: r.info.start_time,
    )
    # an execution's name holds its start time: the same run, another name
    names = {r.info.run_id: r.info.run_name for r in runs}
    names.update({r.info.run_id: f"<execution {i}>" for i, r in enumerate(top, 1)})
    out: dict[str, Any] = {}
    for r in runs:
        parent = r.data.tags.get("mlflow.parentRunId")
        out[names[r.info.run_id]] = {
            "parent": names.get(parent) if parent else None,
            "status": r.info.status,
            "params": sorted(r.data.params),
            "metrics": sorted(r.data.metrics),
            "tags": sorted(
                k for k in r.data.tags if not k.startswith(("mlflow.", "upstream.", "numerics."))
            ),
            "datasets": sorted(d.dataset.name for d in (r.inputs.dataset_inputs or [])),
            "artifacts": sorted(_artifacts(client, r.info.run_id)),
            "models": sorted(
                m.name
                for m in client.search_logged_models([exp.experiment_id])
                if m.source_run_id == r.info.run_id
            ),
        }
    for model in client.search_registered_models():
        versions = client.search_model_versions(f"name = '{model.name}'")
        champion = client.get_model_version_by_alias(model.name, "champion")
        out[f"<registered {model.name}>"] = {
            "versions": len(versions),
            "champion": champion.tags.get("predictor"),
            "run": names.get(champion.run_id),
        }
    return out


@pytest.mark.slow  # two small pipelines up to the report and a server: ~4 min on 2 cores
def test_a_tracking_server_failing_mid_stage_gets_the_tree_the_embedded_store_gets(
    tmp_path: Path,
) -> None:
    found = {}
    for kind in ("embedded", "server"):
        (tmp_path / kind).mkdir()
        repo = make_repo(tmp_path / kind, _params())
        if kind == "embedded":
            uri = f"sqlite:///{repo / 'mlflow.db'}"
            for target in (FIRST, SECOND):
                sh(repo, DVC, "repro", target, environ=env(MLFLOW_TRACKING_URI=uri))
            found[kind] = tree(uri)
            continue
        with running_server(tmp_path / "srv") as server:
            proxy = ErrorProxy(server)
            try:
                environ = env(MLFLOW_TRACKING_URI=proxy.uri)
                proxy.fail_when(_creates_a_run_of(FIRST))
                done = sh(repo, DVC, "repro", FIRST, environ=environ)
                assert proxy.failed > 0  # evaluate@sgd ran against a failing server
                assert "tracking calls are kept in" in done.stderr, done.stderr
                assert list((repo / "runs" / "spool").glob("*.jsonl"))
                assert (repo / "metrics" / "evaluate" / "sgd" / "map.json").exists()
                placeholder = json.loads((repo / "runs" / "evaluate@map.json").read_text())
                assert placeholder["run_id"].startswith("spooled:")
                proxy.heal()
                done = sh(repo, DVC, "repro", SECOND, environ=environ)
                assert "replayed" in done.stderr, done.stderr
                assert not list((repo / "runs" / "spool").glob("*.jsonl"))
                sync = [str(BIN / "bayesavg"), "track", "--sync"]
                assert "nothing spooled" in sh(repo, *sync, environ=environ).stdout
            finally:
                proxy.close()
            found[kind] = tree(server.uri)
            stored = sorted(p.name for p in server.artifacts.rglob("*") if p.is_file())
            ui = subprocess.run(
                [sys.executable, str(CHECK_UI), str(tmp_path / "ui"), "--uri", server.uri],
                env=env(),
                capture_output=True,
                text=True,
            )
        assert ui.returncode == 0, ui.stderr
        assert "registered model bayesavg-mnist5k (champion -> v1)" in ui.stdout, ui.stdout
        assert all(
            (tmp_path / "ui" / f"{page}.png").stat().st_size > 10_000
            for page in ("runs", "run", "models")
        )
        assert not (repo / "mlartifacts").exists()  # the server's store has them
        assert "manifest.json" in stored
    assert set(found["server"]) == set(found["embedded"]) and len(found["server"]) >= 10
    assert "<registered bayesavg-mnist5k>" in found["server"]
    for name, run in found["embedded"].items():
        assert found["server"][name] == run, name


@pytest.mark.slow  # a small pipeline up to finetune@sgd against a server: ~1 min on 2 cores
def test_a_server_killed_while_a_fine_tune_runs_costs_no_result(tmp_path: Path) -> None:
    """The server is killed once finetune@sgd's run exists on it, while the stage trains:
    the stage still writes its outputs and DVC records them; what it could not send waits
    in the spool, and once the server is back ``bayesavg track --sync`` completes the run."""
    raw = _params()
    raw["finetune"]["sgd"].update(epochs=20, batch_size=32)  # seconds: time to be killed
    (tmp_path / "repo").mkdir()
    repo = make_repo(tmp_path / "repo", raw)
    with running_server(tmp_path / "srv") as server:
        environ = env(MLFLOW_TRACKING_URI=server.uri)
        sh(repo, DVC, "repro", "pretrain", environ=environ)
        killed = threading.Event()

        def kill_once_the_run_exists() -> None:
            client = store_client(server.uri)
            deadline = time.time() + 120
            while time.time() < deadline:
                exp = client.get_experiment_by_name("bayesavg")
                if client.search_runs([exp.experiment_id], "attributes.run_name = 'finetune@sgd'"):
                    server.kill()
                    killed.set()
                    return
                time.sleep(0.1)

        watcher = threading.Thread(target=kill_once_the_run_exists)
        watcher.start()
        done = sh(repo, DVC, "repro", "finetune@sgd", environ=environ)
        watcher.join()
        assert killed.is_set()
        assert "tracking calls are kept in" in done.stderr, done.stderr
        assert (repo / "models" / "sgd" / "posterior.pt").is_file()
        assert "up to date" in sh(repo, DVC, "status", "finetune@sgd", environ=environ).stdout
        run_id = json.loads((repo / "runs" / "finetune@sgd.json").read_text())["run_id"]
        server.start()
        sync = sh(repo, str(BIN / "bayesavg"), "track", "--sync", environ=environ)
        assert "spooled calls from 1 spool(s)" in sync.stdout, sync.stdout
        found = store_client(server.uri).get_run(run_id)
        assert found.info.status == "FINISHED"
        history = store_client(server.uri).get_metric_history(run_id, "train/loss")
        assert len(history) == 20  # every epoch, sent before the outage or replayed
