"""The MLflow UI's address of this project's experiment, for ``make ui`` to print
(``ui_server``).

The experiment is ``tracking.experiment`` of params.yaml; its id is read from the store
(``mlflow.db``) with sqlite3 alone, without importing mlflow, so the address shows at
once. Without a store or that experiment yet, the address of the experiments list.

``end_orphans``: runs a killed stage left RUNNING (its process is gone: a SIGKILL of its group)
are ended KILLED as the next stage would end them (``bayesavg.tracking.orphans``), so the
UI does not show them running for good; mlflow is imported only when the experiment
has a RUNNING run.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
VIEW = "?workflowType=machine_learning"  # MLflow 3's model-training view (README)


def experiment_id(store: Path, name: str) -> str | None:
    """The id of experiment ``name`` in the SQLite store, or None."""
    if not store.is_file():
        return None
    try:
        with sqlite3.connect(f"{store.as_uri()}?mode=ro", uri=True) as db:
            row = db.execute("SELECT experiment_id FROM experiments WHERE name = ?", (name,))
            found = row.fetchone()
    except sqlite3.Error:
        return None
    return str(found[0]) if found else None


def has_running(store: Path, exp_id: str) -> bool:
    with sqlite3.connect(f"{store.as_uri()}?mode=ro", uri=True) as db:
        row = db.execute(
            "SELECT 1 FROM runs WHERE experiment_id = ? AND status = 'RUNNING' "
            "AND lifecycle_stage = 'active' LIMIT 1",
            (exp_id,),
        )
        return row.fetchone() is not None


def end_orphans(root: Path) -> list[str]:
    """End KILLED the experiment's runs whose process on this machine is gone: ``name (id)``."""
    store = root / "mlflow.db"
    found = experiment_id(store, experiment(root))
    if found is None or not has_running(store, found):
        return []
    from bayesavg.tracking.mlflow_run import store_client
    from bayesavg.tracking.orphans import sweep

    uri = f"sqlite:///{store}"
    return sweep(store_client(uri), found, uri)


def experiment(root: Path) -> str:
    params = yaml.safe_load((root / "params.yaml").read_text()) or {}
    return (params.get("tracking") or {}).get("experiment", "bayesavg")


def url(root: Path, port: int) -> str:
    name = experiment(root)
    found = experiment_id(root / "mlflow.db", name)
    base = f"http://127.0.0.1:{port}/#/experiments"
    if found is None:
        return f"{base}{VIEW}  (no experiment {name!r} in mlflow.db yet: `make run` first)"
    return f"{base}/{found}/runs{VIEW}"
