"""Which pipeline execution a stage runs in: its nearest ``dvc`` ancestor process.

``_common.tracked`` makes each stage's MLflow run a child of that execution's parent
run, so the stages of one ``dvc repro`` or ``dvc exp run`` show as one group. Apart
from ``_common`` because it reads the process tree, not the workspace.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

EXECUTION_ENV = "BAYESAVG_EXECUTION"


def _dvc_args(cmdline: list[str]) -> list[str] | None:
    """The arguments of ``dvc ...``, ``python .../bin/dvc ...`` or ``python -m dvc ...``;
    None for any other command."""
    for i, part in enumerate(cmdline[:2]):
        if Path(part).name == "dvc":
            return cmdline[i + 1 :]
    return cmdline[3:] if cmdline[1:3] == ["-m", "dvc"] else None


def execution() -> dict[str, str] | None:
    """The pipeline execution this stage runs in: its nearest ``dvc`` ancestor process
    (``dvc repro``, ``dvc exp run``, a queue worker's ``dvc exp exec-run``), which all
    stages of one execution share and no other execution does. Its key is that
    process's host, pid, start time and DVC experiment name; its name is the DVC
    experiment's, else ``dvc repro <start>``. None when no DVC process started us.

    ``scripts/repro.py`` runs each stage through a ``dvc repro`` of its own, several
    at once; it names the one execution they form in ``BAYESAVG_EXECUTION`` (these
    same fields, as JSON), which comes first."""
    import json

    import psutil

    named = os.environ.get(EXECUTION_ENV)
    if named:
        return {str(k): str(v) for k, v in json.loads(named).items()}
    for proc in psutil.Process().parents():
        try:
            args = _dvc_args(proc.cmdline())
            if args is None:
                continue
            started = proc.create_time()
        except psutil.Error:
            continue
        # The UI's Source column: what ran the pipeline (dvc repro, dvc exp exec-run).
        source = " ".join(["dvc", *args[:2]])
        return described(proc.pid, started, os.environ.get("DVC_EXP_NAME", ""), source)
    return None


def described(pid: int, started: float, exp: str, source: str) -> dict[str, str]:
    """The execution of process ``pid`` started at ``started`` (seconds since the epoch):
    its key, name (the DVC experiment's, else ``dvc repro <start>``) and tags. Also what
    ``scripts/repro.py`` puts in ``BAYESAVG_EXECUTION`` for itself."""
    import socket

    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    return {
        "key": f"{socket.gethostname()}:{pid}:{int(started * 1000)}:{exp}",
        "name": exp or f"dvc repro {when}",
        **({"dvc_exp_name": exp} if exp else {}),
        "mlflow.source.name": source,
    }
