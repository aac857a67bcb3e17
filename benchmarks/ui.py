"""The MLflow UI that ``make ui`` starts against a plain ``mlflow ui``, side by side.

``ours``: ``scripts/ui_server.py``'s command and environment (no GenAI job runner, one
web worker per core, at most four); ``plain``: ``mlflow ui`` with MLflow's defaults (four
workers, the job runner on). Both serve a copy of the project's ``mlflow.db`` (run
``make run`` first). Per start, in rounds that alternate which goes first:

- seconds from the command to the first answer of ``/health``;
- once settled (the job runner starts its consumers after the server answers): the
  processes of the server's session and their resident memory (RSS, summed);
- what the runs page asks: one runs search, then metric histories 8 at a time (the
  first ``--histories`` of every run's metrics), in seconds.

Run ``python benchmarks/ui.py`` (about 3 minutes on 2 cores); results go to
``benchmarks/ui.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

import ui_server  # noqa: E402
from mlflow_server import free_port, session  # noqa: E402
from timing import (  # noqa: E402
    finish,
    load_average,
    median_range,
    ratio,
    ratio_fields,
    rotation,
    write_results,
)

from bayesavg.runtime.numerics import usable_cores  # noqa: E402
from bayesavg.tracking.spool import check_reachable  # noqa: E402

SETTLE = 10.0  # seconds after the first answer before counting processes


def _variants(store: Path, port: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    uri, artifacts = f"sqlite:///{store}", store.parent / "mlartifacts"
    ours = ui_server.command(uri, artifacts, port)
    plain = ours[: ours.index("--workers")]  # MLflow's own worker count
    base = {k: v for k, v in os.environ.items() if k != ui_server.JOB_RUNNER}
    return {
        "ours": (ours, ui_server.environ(base)),
        "plain": (plain, {**ui_server.environ(base), ui_server.JOB_RUNNER: "true"}),
    }


def _runs_page(base: str, histories: int) -> tuple[float, int]:
    """Seconds for one runs search and then ``histories`` metric histories, 8 at a time."""

    def call(path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        with urllib.request.urlopen(urllib.request.Request(base + path, data, headers)) as r:
            return json.loads(r.read())

    exps = call("/api/2.0/mlflow/experiments/search", {"max_results": 1000})["experiments"]
    ids = [e["experiment_id"] for e in exps]
    started = time.perf_counter()
    runs = call("/api/2.0/mlflow/runs/search", {"experiment_ids": ids, "max_results": 1000})
    pairs = [
        (run["info"]["run_id"], metric["key"])
        for run in runs.get("runs", [])
        for metric in run["data"].get("metrics", [])
    ][:histories]
    query = "/api/2.0/mlflow/metrics/get-history?run_id={}&metric_key={}"

    def history(pair: tuple[str, str]) -> Any:
        return call(query.format(pair[0], urllib.parse.quote(pair[1])))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(history, pairs))
    return time.perf_counter() - started, len(pairs)


def _once(cmd: list[str], environ: dict[str, str], port: int, histories: int) -> dict[str, Any]:
    started = time.perf_counter()
    server = subprocess.Popen(
        cmd,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        while check_reachable(base) is not None:
            if server.poll() is not None or time.perf_counter() - started > 120:
                raise SystemExit(f"{cmd[1:3]} did not answer on {base}")
            time.sleep(0.1)
        up = time.perf_counter() - started
        time.sleep(SETTLE)
        running = session(server.pid)
        processes, rss = len(running), sum(rss for _, rss in running)
        seconds, calls = _runs_page(base, histories)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    return {
        "seconds_to_first_answer": round(up, 2),
        "processes": processes,
        "rss_mb": round(rss / 2**20),
        "runs_page_seconds": round(seconds, 2),
        "histories": calls,
    }


KEYS = ("seconds_to_first_answer", "processes", "rss_mb", "runs_page_seconds")


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> list[float]:
        return [round(v, 2) for v in median_range([r[key] for r in rounds])]

    return {f"{key}_median_min_max": med(key) for key in KEYS} | {"rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "ui.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--histories", type=int, default=2000, help="metric histories asked")
    parser.add_argument("--store", type=Path, default=ROOT / "mlflow.db")
    args = parser.parse_args()
    if not args.store.is_file():
        print(f"no MLflow store at {args.store}: run `make run` first", file=sys.stderr)
        raise SystemExit(2)
    began = time.perf_counter()
    results: dict[str, Any] = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "usable_cores": usable_cores(),
            "load_average_start": load_average(),
        }
    }
    found: dict[str, list[dict[str, Any]]] = {"ours": [], "plain": []}
    with tempfile.TemporaryDirectory(prefix="bayesavg-ui-") as tmp:
        for r in range(args.rounds):
            for name in rotation(list(found), r):
                store = Path(tmp) / name / "mlflow.db"  # a fresh copy: a start may migrate it
                shutil.rmtree(store.parent, ignore_errors=True)
                store.parent.mkdir()
                shutil.copyfile(args.store, store)
                port = free_port()
                cmd, environ = _variants(store, port)[name]
                found[name].append(_once(cmd, environ, port, args.histories))
                print(name, found[name][-1], flush=True)
    results |= {name: _summary(rounds) for name, rounds in found.items()}
    results["plain_over_ours"] = {}  # per round, median and range over rounds
    for key in KEYS:
        plain, ours = ([r[key] for r in found[name]] for name in ("plain", "ours"))
        results["plain_over_ours"] |= ratio_fields(key, ratio(plain, ours), 2, best=False)
    finish(results, began)
    write_results(args.out, results)
    print(json.dumps(results["plain_over_ours"]))


if __name__ == "__main__":
    main()
