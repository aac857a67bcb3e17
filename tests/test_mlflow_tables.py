"""The tests' MLflow stores are copies of one database (``conftest.mlflow_tables``): a
copy must open as the store MLflow creates on an empty file, or every tracking test
would test something no user has."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy
from mlflow.store.db.utils import _get_schema_version
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore


def _shape(store: SqlAlchemyStore) -> dict[str, object]:
    """Schema revision, every table with its columns, and the experiments (less times)."""
    found = sqlalchemy.inspect(store.engine)
    return {
        "revision": _get_schema_version(store.engine),
        "tables": {
            t: sorted(c["name"] for c in found.get_columns(t)) for t in found.get_table_names()
        },
        "experiments": [
            (e.experiment_id, e.name, e.artifact_location, e.lifecycle_stage, e.tags)
            for e in store.search_experiments()
        ],
    }


def test_a_copied_store_opens_as_a_new_one(tmp_path: Path, mlflow_store: tuple[str, str]) -> None:
    uri, artifacts = mlflow_store
    copied = SqlAlchemyStore(uri, artifacts)
    new = SqlAlchemyStore(f"sqlite:///{tmp_path / 'new.db'}", artifacts)
    assert _shape(copied) == _shape(new)
    default = copied.get_experiment("0")
    assert (default.name, default.artifact_location) == ("Default", f"{artifacts}/0")
