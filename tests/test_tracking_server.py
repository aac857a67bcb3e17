"""The pipeline against a team's tracking server over HTTP (issue 30 §1): the same tree
of runs as with the embedded SQLite store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlflow_server import running_server
from pipeline_repo import DVC, env, make_repo, prune_landscape, sh, small_params

from bayesavg.tracking.mlflow_run import store_client

STAGES = "evaluate@sgd"  # validate, data, pretrain, finetune@sgd and evaluate@sgd's two runs


def _params() -> dict[str, Any]:
    raw = small_params(epochs=1, pretrain_epochs=1, members=1)
    raw["device"] = "cpu"
    raw["finetune"] = {"sgd": raw["finetune"]["sgd"]}
    raw["evaluate"]["predictors"] = {"sgd": raw["evaluate"]["predictors"]["sgd"]}
    raw["evaluate"]["plane"]["trajectories"] = []
    raw["evaluate"]["dswag_sweep"]["workers"] = []
    raw["evaluate"]["ood"]["sets"] = []
    return prune_landscape(raw)


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
    top = {r.info.run_id for r in runs if "mlflow.parentRunId" not in r.data.tags}
    # the execution's name holds its start time: the same run, another name
    names = {
        r.info.run_id: "<execution>" if r.info.run_id in top else r.info.run_name for r in runs
    }
    out = {}
    for r in runs:
        parent = r.data.tags.get("mlflow.parentRunId")
        out[r.info.run_name if parent else "<execution>"] = {
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
    return out


@pytest.mark.slow  # two small pipelines and a server: about 3 minutes on 2 cores
def test_a_tracking_server_gets_the_tree_of_runs_the_embedded_store_gets(
    tmp_path: Path,
) -> None:
    found = {}
    for kind in ("embedded", "server"):
        (tmp_path / kind).mkdir()
        repo = make_repo(tmp_path / kind, _params())
        if kind == "embedded":
            uri = f"sqlite:///{repo / 'mlflow.db'}"
            sh(repo, DVC, "repro", STAGES, environ=env(MLFLOW_TRACKING_URI=uri))
            found[kind] = tree(uri)
            continue
        with running_server(tmp_path / "srv") as server:
            sh(repo, DVC, "repro", STAGES, environ=env(MLFLOW_TRACKING_URI=server.uri))
            found[kind] = tree(server.uri)
            stored = sorted(p.name for p in server.artifacts.rglob("*") if p.is_file())
        assert not (repo / "mlartifacts").exists()  # the server's store has them
        assert "manifest.json" in stored
    assert set(found["server"]) == set(found["embedded"]) and len(found["server"]) >= 6
    for name, run in found["embedded"].items():
        assert found["server"][name] == run, name
