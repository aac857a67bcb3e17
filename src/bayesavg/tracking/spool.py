"""Tracking that never costs a result: the calls a stage could not send, kept and sent later.

The worker (``worker.serve``) carries out a stage's calls in order. When one fails (the
server went away, answers errors, a token expired), the worker stops calling the store
and appends that call and every later one to a spool file under ``runs/spool/``, beside
the stages' run files; the stage goes on, writes its outputs, and ends with one line
saying so. ``replay`` sends a spool's calls in order into the right runs: a run opened
before the outage is reattached by its id, a run started during it is created then. It
records after each call how far it got (and the ids of the runs it created), so an
interrupted replay continues where it stopped and a finished spool is removed: replaying
twice sends nothing twice. The next stage that reaches the store replays what it finds
(``replay_all``), and so does ``bayesavg track --sync``.

The start of a stage is the other case: when an HTTP tracking server cannot be reached
then, ``check_reachable`` says so in one line before anything is computed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

# MLflow's HTTP client retries 7 times with a backoff factor of 2 by default (minutes
# per call): bounded here, stated in the README, overridable by the same variables.
RETRIES = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
PROBE_SECONDS = 5.0  # one attempt's timeout when a stage starts; two attempts at most


def bound_retries() -> None:
    """MLflow's HTTP retries bounded (2 retries, backoff 1 s, 10 s per request: a call
    gives up after about 35 s) unless the user set them."""
    for key, value in RETRIES.items():
        os.environ.setdefault(key, value)


def is_remote(tracking_uri: str) -> bool:
    return urlparse(tracking_uri).scheme in ("http", "https")


def check_reachable(tracking_uri: str) -> str | None:
    """None when the tracking server answers; else one line naming the URI, the cause
    and the fix. Only HTTP(S) servers are probed (a local SQLite store is a file)."""
    if not is_remote(tracking_uri):
        return None
    import urllib.error
    import urllib.request

    url = tracking_uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
    headers = {}
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    cause = ""
    for attempt in range(2):
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=PROBE_SECONDS
            ):
                return None
        except urllib.error.HTTPError as err:
            if err.code in (401, 403):
                return (
                    f"MLflow tracking server {tracking_uri} refused the credentials (HTTP "
                    f"{err.code}): set MLFLOW_TRACKING_TOKEN (or MLFLOW_TRACKING_USERNAME and "
                    "_PASSWORD), or unset MLFLOW_TRACKING_URI to track into mlflow.db"
                )
            cause = f"HTTP {err.code} {err.reason}"
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            cause = str(reason.strerror if isinstance(reason, OSError) else reason) or repr(err)
        if attempt == 0:
            time.sleep(1.0)
    return (
        f"MLflow tracking server {tracking_uri} is unreachable ({cause}): start it "
        "(mlflow server ...), correct MLFLOW_TRACKING_URI, or unset it to track into "
        "mlflow.db; nothing was computed"
    )


class Spool:
    """The calls of one worker that could not be sent, one JSON line each, in order.

    Line 1 says why and where to (``outage``); ``attach`` names a run opened before the
    outage by its id; every other line is a call, with ``run``: the index of its run
    among this worker's runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls = 0

    @classmethod
    def open(cls, folder: Path, tracking_uri: str, cause: str) -> Spool:
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        spool = cls(folder / f"{stamp}-{os.getpid()}.jsonl")
        spool._write({"op": "outage", "uri": tracking_uri, "cause": cause, "at": time.time()})
        return spool

    def attach(self, run: int, run_id: str) -> None:
        self._write({"op": "attach", "run": run, "run_id": run_id})

    def add(self, run: int, op: str, fields: Mapping[str, Any]) -> None:
        self._write({"op": op, "run": run, **fields})
        self.calls += 1

    def _write(self, record: Mapping[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _progress_path(spool: Path) -> Path:
    return spool.with_suffix(".progress.json")


def replay(spool: Path, tracking_uri: str, artifact_location: str) -> int:
    """Send a spool's calls in order; return how many were sent now. Progress is saved
    after each call, and the spool removed when all are sent."""
    from .mlflow_run import Run, store_client
    from .store import open_run

    lines = [json.loads(line) for line in spool.read_text(encoding="utf-8").splitlines() if line]
    progress_file = _progress_path(spool)
    progress = (
        json.loads(progress_file.read_text()) if progress_file.exists() else {"done": 0, "runs": {}}
    )
    client = store_client(tracking_uri)
    runs: dict[str, Any] = {k: Run(client, v, tracking_uri) for k, v in progress["runs"].items()}
    sent = 0
    for i in range(progress["done"], len(lines)):
        record = dict(lines[i])
        op, run = record.pop("op"), str(record.pop("run", ""))
        if op == "attach":
            runs[run] = Run(client, record["run_id"], tracking_uri)
            progress["runs"][run] = record["run_id"]
        elif op == "start":
            opened = open_run(
                record.pop("run_name"),
                tracking_uri=tracking_uri,
                artifact_location=artifact_location,
                **record,
            )
            runs[run] = opened
            progress["runs"][run] = opened.run_id
        elif op == "end":
            runs[run].terminate(record["status"])
        elif op != "outage":
            getattr(runs[run], op)(**record)
        sent += op not in ("outage", "attach")
        progress["done"] = i + 1
        progress_file.write_text(json.dumps(progress))
    spool.unlink()
    progress_file.unlink(missing_ok=True)
    return sent


def pending(folder: Path, tracking_uri: str) -> list[Path]:
    """The spools in ``folder`` meant for ``tracking_uri``, oldest first."""
    found = []
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        with path.open(encoding="utf-8") as f:
            first = f.readline()
        try:
            if json.loads(first).get("uri") == tracking_uri:
                found.append(path)
        except ValueError:
            continue
    return found


def replay_all(folder: Path, tracking_uri: str, artifact_location: str) -> tuple[int, int]:
    """Replay every pending spool for the store: (spools, calls) sent."""
    spools = pending(folder, tracking_uri)
    return len(spools), sum(replay(s, tracking_uri, artifact_location) for s in spools)
