"""What every stage shares: project root, params, the MLflow run and its id file.

This is the only place that knows about DVC (its env vars and workspaces);
the library under src/ does not.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from bayesavg.cli import run_entry
from bayesavg.config import Params, load_params
from bayesavg.io import write_json

PARAMS = Path("params.yaml")
PREPARED = Path("data/prepared")
RUNS = Path("runs")


def project_root() -> Path:
    """The repo whose mlflow.db and mlartifacts/ receive this run.

    DVC sets ``DVC_ROOT`` to the parent repo also for ``dvc exp run --temp``
    and ``--queue``, whose stages run in a temporary copy under .dvc/tmp.
    """
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()).resolve()


def main(fn: Callable[[], None]) -> None:
    run_entry(fn)


def params() -> Params:
    return load_params(PARAMS)


def raw_params() -> dict[str, Any]:
    return yaml.safe_load(PARAMS.read_text(encoding="utf-8"))


def run_file(stage: str) -> Path:
    return RUNS / f"{stage}.json"


def run_id(stage: str) -> str | None:
    try:
        return json.loads(run_file(stage).read_text())["run_id"]
    except (OSError, ValueError, KeyError):
        return None


@contextlib.contextmanager
def tracked(
    stage: str,
    p: Params,
    logged: Mapping[str, Any],
    upstream: list[str],
    id_file: Path | None = None,
) -> Iterator[Any]:
    """An MLflow run named after the DVC stage; its id goes to ``id_file``.

    ``id_file`` defaults to ``runs/<stage>.json``, a DVC output, so a stage
    that DVC skips keeps the link to the run that made its outputs.
    """
    from bayesavg.tracking import default_store, git_commit, start_run

    root = project_root()
    uri, artifacts = default_store(root)
    commit = git_commit(Path.cwd())
    tags = {
        "mlflow.source.git.commit": commit,
        "git_commit": commit,
        "dvc_stage": stage,
        "dvc_exp_name": os.environ.get("DVC_EXP_NAME", ""),
        "dvc_exp_baseline_rev": os.environ.get("DVC_EXP_BASELINE_REV", ""),
        "command": " ".join(sys.argv),
    }
    tags.update({f"upstream.{u}": rid for u in upstream if (rid := run_id(u))})
    with start_run(
        stage,
        tracking_uri=uri,
        artifact_location=artifacts,
        experiment=p.tracking.experiment,
        tags=tags,
    ) as run:
        run.log_params({"seed": p.seed, "device": p.device, **logged})
        yield run
    write_json(
        id_file or run_file(stage),
        {"run_id": run.run_id, "stage": stage, "experiment": p.tracking.experiment},
    )
