"""How long tracking outages cost a stage (issue 30), against a real ``mlflow server``.

(a) A server down when a stage starts: ``dvc repro data`` in a fresh project with
    ``MLFLOW_TRACKING_URI`` at a closed port and at an unknown host: wall time to the
    one-line error (the median of 3 rounds, the two cases in turn first, after an untimed
    run), the line, the exit codes, and whether anything was written.
(b) A server lost during a stage: a tracking worker logs one metric, the server is
    killed (or, behind a proxy, starts answering HTTP 503), and the stage sends 100 more
    metric calls: seconds from the outage until the worker has spooled them and exited.
(c) The replay: ``bayesavg track --sync`` once the server is back, process start
    included, and what it said; the metric history must then hold all 101 points.

Run ``python benchmarks/outage.py`` (about 2 minutes on 2 cores); results go to
``benchmarks/outage.json``. Uses the tests' server and proxy (``tests/mlflow_server.py``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from mlflow_server import ErrorProxy, MlflowServer, running_server, server_worker  # noqa: E402
from pipeline_repo import BIN, DVC, default_params, env, make_repo  # noqa: E402
from timing import rotation  # noqa: E402

DOWN = {"refused": "http://127.0.0.1:9", "unknown_host": "http://tracking.invalid:5000"}
CALLS = 100


def at_start(root: Path, rounds: int) -> dict[str, Any]:
    """(a): `dvc repro data` against a server that is not there: one untimed run first (the
    first process pays for cold caches), then ``rounds`` of both cases, in turn first."""
    (root / "repo").mkdir()
    repo = make_repo(root / "repo", default_params())

    def once(uri: str) -> tuple[float, subprocess.CompletedProcess[str]]:
        started = time.perf_counter()
        cmd = [DVC, "repro", "data"]
        env_ = env(MLFLOW_TRACKING_URI=uri)
        done = subprocess.run(cmd, cwd=repo, env=env_, capture_output=True, text=True)
        return time.perf_counter() - started, done

    once(DOWN["refused"])
    seconds: dict[str, list[float]] = {name: [] for name in DOWN}
    last: dict[str, subprocess.CompletedProcess[str]] = {}
    for r in range(rounds):
        for name in rotation(list(DOWN), r):
            took, last[name] = once(DOWN[name])
            seconds[name].append(round(took, 2))
    out = {}
    for name, done in last.items():
        stage_exit = re.search(r"exited with (\d+)", done.stderr)
        out[name] = {
            "seconds_to_the_line": statistics.median(seconds[name]),
            "seconds_each_round": seconds[name],
            "line": [ln for ln in done.stderr.splitlines() if ln.startswith("error: MLflow")],
            "dvc_exit_code": done.returncode,
            "stage_exit_code": int(stage_exit.group(1)) if stage_exit else None,
            "written": (repo / "data" / "prepared" / "manifest.json").exists(),
        }
    return out


def mid_stage(server: MlflowServer, root: Path, mode: str) -> dict[str, Any]:
    """(b) and (c) for one kind of outage: ``killed`` or ``http_503``."""
    from bayesavg.tracking.mlflow_run import store_client

    proxy = ErrorProxy(server) if mode == "http_503" else None
    uri = proxy.uri if proxy else server.uri
    project = root / mode
    (project / "runs").mkdir(parents=True)
    environ = env(MLFLOW_TRACKING_URI=uri)
    tracker, _ = server_worker(uri, project / "runs" / "spool")
    with tracker.run("finetune@swag", experiment="outage", tags={}, inputs={}, close=False) as run:
        run.log_metrics({"loss": 1.0}, step=1)
        run_id = run.run_id
        while not store_client(server.uri).get_run(run_id).data.metrics:
            time.sleep(0.1)
        if proxy is not None:
            proxy.fail()
        else:
            server.kill()
        started = time.perf_counter()
        for step in range(2, CALLS + 2):
            run.log_metrics({"loss": 1.0 / step}, step=step)
    tracker.close()
    spooled = time.perf_counter() - started
    if proxy is not None:
        proxy.heal()
    else:
        server.start()
    started = time.perf_counter()
    sync = [str(BIN / "bayesavg"), "track", "--sync", "--root", str(project)]
    done = subprocess.run(sync, env=environ, capture_output=True, text=True)
    replay = time.perf_counter() - started
    if proxy is not None:
        proxy.close()
    history = store_client(server.uri).get_metric_history(run_id, "loss")
    return {
        "seconds_outage_to_worker_exit": round(spooled, 2),
        "replay_seconds": round(replay, 2),
        "replay_said": done.stdout.strip().splitlines()[-1:],
        "history_points": len(history),
        "expected_points": CALLS + 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "outage.json")
    parser.add_argument("--rounds", type=int, default=3, help="of (a), after a warm-up run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bayesavg-outage-") as tmp:
        root = Path(tmp)
        found: dict[str, Any] = {"at_start": at_start(root, args.rounds)}
        with running_server(root / "server") as server:
            for mode in ("killed", "http_503"):
                found[mode] = mid_stage(server, root, mode)
    args.out.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    print(json.dumps(found, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
