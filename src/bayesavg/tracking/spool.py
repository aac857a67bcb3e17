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

A run started during an outage has no id yet: the stage gets a placeholder
(``spooled:<spool>:<n>``), which its run file records and later stages may pass on (a
resumed run, a registered candidate). The replay keeps each placeholder's real id in
``ids.json`` beside the spools, rewrites the run files that hold it, and resolves it in
every later call. Files a spooled call names (an artifact, a model's posterior) are kept
beside the spool as hard links (copies across file systems) when the call is spooled:
the stage may delete its scratch files, and a later run may replace an output.

The start of a stage is the other case: when an HTTP tracking server cannot be reached
then, ``check_reachable`` says so in one line before anything is computed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
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
PLACEHOLDER = "spooled:"
IDS = "ids.json"  # placeholder -> the run id its replay created
# the fields of a call that name a file or folder to send
FILE_FIELDS = {
    "log_artifact": ("path",),
    "log_artifact_once": ("path",),
    "log_model": ("posterior", "code", "bn_images"),
}


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

    @property
    def files(self) -> Path:
        """Where the files its calls name are kept until the replay."""
        return self.path.with_suffix(".files")

    def placeholder(self, run: int) -> str:
        """The id a stage is given for run ``run`` started during the outage."""
        return f"{PLACEHOLDER}{self.path.name}:{run}"

    def attach(self, run: int, run_id: str) -> None:
        self._write({"op": "attach", "run": run, "run_id": run_id})

    def add(self, run: int, op: str, fields: Mapping[str, Any]) -> None:
        fields = dict(fields)
        for key in FILE_FIELDS.get(op, ()):
            if fields.get(key):
                # a file that is gone already stays named as it was: its call fails at the
                # replay, as it would have failed now; the stage goes on either way
                with contextlib.suppress(OSError):
                    fields[key] = str(self._keep(Path(fields[key]), key))
        self._write({"op": op, "run": run, **fields})
        self.calls += 1

    def _keep(self, path: Path, field: str) -> Path:
        """A hard link (a copy across file systems) of ``path`` beside the spool, apart
        from the call's other fields' files (a model's may share a name)."""
        kept = self.files / str(self.calls) / field / path.name
        kept.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, kept, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(path), str(kept))
        return kept

    def _write(self, record: Mapping[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def load_ids(folder: Path) -> dict[str, str]:
    """Placeholder -> real run id, for every run a replay in ``folder`` created."""
    path = folder / IDS
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def resolve(value: Any, ids: Mapping[str, str]) -> Any:
    """``value`` with every placeholder the replays know replaced by its run id."""
    if isinstance(value, str):
        return ids.get(value, value) if value.startswith(PLACEHOLDER) else value
    if isinstance(value, Mapping):
        return {k: resolve(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, ids) for v in value]
    return value


def _record_id(folder: Path, ids: dict[str, str], placeholder: str, run_id: str) -> None:
    """Keep the mapping (atomically) and put the real id in the run files that hold the
    placeholder (``runs/*.json``, the folder above the spools)."""
    from ..runtime.io import write_json

    ids[placeholder] = run_id
    write_json(folder / IDS, ids)
    for path in folder.parent.glob("*.json"):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("run_id") == placeholder:
            write_json(path, {**record, "run_id": run_id})


def _progress_path(spool: Path) -> Path:
    return spool.with_suffix(".progress.json")


def replay(spool: Path, tracking_uri: str, artifact_location: str) -> int:
    """Send a spool's calls in order; return how many were sent now. Progress is saved
    after each call, and the spool removed when all are sent."""
    from .mlflow_run import Run, store_client
    from .store import open_run

    lines = [json.loads(line) for line in spool.read_text(encoding="utf-8").splitlines() if line]
    ids = load_ids(spool.parent)
    progress_file = _progress_path(spool)
    progress = (
        json.loads(progress_file.read_text()) if progress_file.exists() else {"done": 0, "runs": {}}
    )
    client = store_client(tracking_uri)
    runs: dict[str, Any] = {k: Run(client, v, tracking_uri) for k, v in progress["runs"].items()}
    sent = 0
    for i in range(progress["done"], len(lines)):
        record = resolve(dict(lines[i]), ids)
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
            placeholder = Spool(spool).placeholder(int(run))
            _record_id(spool.parent, ids, placeholder, opened.run_id)
        elif op == "end":
            runs[run].terminate(**record)
        elif op != "outage":
            try:
                getattr(runs[run], op)(**record)
            except Exception as err:
                if check_reachable(tracking_uri) is not None:
                    raise  # the store is down again: the rest waits for the next replay
                _skip(spool, lines[i], err)  # the store refuses this call: never again
        sent += op not in ("outage", "attach")
        progress["done"] = i + 1
        progress_file.write_text(json.dumps(progress))
    spool.unlink()
    progress_file.unlink(missing_ok=True)
    shutil.rmtree(Spool(spool).files, ignore_errors=True)
    return sent


def _skip(spool: Path, record: Mapping[str, Any], err: Exception) -> None:
    """Keep a call the reachable store refused (a file gone, a value it rejects) beside
    the spools, with why, instead of retrying it at every replay and blocking the rest."""
    import sys

    cause = f"{type(err).__name__}: {err}".splitlines()[0][:300]
    with (spool.parent / "refused.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"spool": spool.name, "call": record, "error": cause}) + "\n")
    sys.stderr.write(
        f"warning: the tracking store refused a spooled {record['op']} ({cause}); it is kept "
        f"in {spool.parent / 'refused.jsonl'} and the replay goes on\n"
    )


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


def replay_pending(folder: Path, tracking_uri: str, artifact_location: str) -> None:
    """``replay_all`` at a stage's start, saying what it sent on stderr; a failure is one
    warning line and leaves the spools for later (the stage's own calls go on)."""
    try:
        spools, calls = replay_all(folder, tracking_uri, artifact_location)
    except Exception as err:
        first = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        sys.stderr.write(f"warning: could not replay the tracking spool in {folder} ({first})\n")
        return
    if spools:
        sys.stderr.write(f"tracking: replayed {calls} spooled calls from {spools} spool(s)\n")
