"""Start MLflow's UI over this project's store as ``make ui`` does, sized for one user.

``mlflow ui`` on its own (MLflow 3.17) starts four web workers and a job runner for its
GenAI features (LLM judges, prompt optimisation): eight more Python processes that each
import mlflow. On 2 cores that is 15 processes, 3.1 GB of memory and 17 s before the
first answer. Here: no job runner unless ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION`` is set
(nothing in this project uses it), and one web worker per usable core, at most MLflow's
four: 5 processes, 0.8 GB, 8 s, and the runs page's requests served as fast as with
four workers (``benchmarks/ui.py``).

    python scripts/ui_server.py [--port 5000] [--root DIR]

First ends KILLED the runs a vanished process left RUNNING and prints the address of the
experiment (``ui_url``), then becomes ``mlflow ui`` (exec): Ctrl-C stops it as before.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ui_url

from bayesavg.runtime.numerics import usable_cores

JOB_RUNNER = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
MLFLOW_WORKERS = 4  # `mlflow ui --workers` default
BIN = Path(sys.executable).parent


def workers(cores: int) -> int:
    """Web workers: MLflow's four, at most one per core (each holds its own mlflow)."""
    return max(1, min(MLFLOW_WORKERS, cores))


def command(store_uri: str, artifacts: Path, port: int) -> list[str]:
    """The ``mlflow ui`` command line for ``store_uri`` on 127.0.0.1:``port``."""
    cores = usable_cores()
    return [
        *(str(BIN / "mlflow"), "ui", "--backend-store-uri", store_uri),
        *("--default-artifact-root", str(artifacts), "--host", "127.0.0.1"),
        *("--port", str(port), "--workers", str(workers(cores))),
    ]


def environ(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with telemetry off and the job runner off unless ``base`` sets it."""
    out = {**base, "MLFLOW_DISABLE_TELEMETRY": "true"}
    out.setdefault(JOB_RUNNER, "false")
    out["PATH"] = f"{BIN}{os.pathsep}{out.get('PATH', '')}"
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument(
        "--root", type=Path, default=ui_url.ROOT, help="the project (default: this one)"
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    ended = ui_url.end_orphans(root)
    if ended:
        print(f"Ended KILLED {len(ended)} run(s) left RUNNING by a process that is gone: ", end="")
        print(", ".join(ended))
    print(f"Runs: {ui_url.url(root, args.port)}", flush=True)
    cmd = command(f"sqlite:///{root / 'mlflow.db'}", root / "mlartifacts", args.port)
    os.execve(cmd[0], cmd, environ(os.environ))


if __name__ == "__main__":
    main(sys.argv[1:])
