"""Where a run comes from and where it is stored: MLflow's source tags, the git commit,
the default store of a project root. No mlflow import: every stage reads these before
its tracking worker has started."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def source_tags(script: str, commit: str) -> dict[str, str]:
    """MLflow's own tags for where a run came from, which the UI's Source, User and Version
    columns show (the client API, unlike ``mlflow.start_run``, sets none of them)."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return {
        "mlflow.source.name": script,
        "mlflow.source.type": "LOCAL",
        "mlflow.user": user,
        "mlflow.source.git.commit": commit,
    }


def git_commit(cwd: str | Path) -> str:
    """HEAD's commit, with ``-dirty`` if the work tree differs, or ``unknown``."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


def default_store(root: str | Path) -> tuple[str, str]:
    """(tracking URI, artifact location) for a project root.

    ``MLFLOW_TRACKING_URI`` overrides the default ``sqlite:///<root>/mlflow.db``.
    Artifacts go to ``<root>/mlartifacts`` for experiments created here; with a tracking
    server (http, https) to the server's artifact store (location ""), not to a folder
    of the machine that happened to create the experiment.
    """
    root = Path(root).resolve()
    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root / 'mlflow.db'}"
    if uri.startswith(("http://", "https://")):
        return uri, ""
    return uri, (root / "mlartifacts").as_uri()
