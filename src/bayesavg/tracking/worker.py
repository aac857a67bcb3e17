"""MLflow tracking in a helper process, so a stage pays for MLflow while it loads torch.

Importing mlflow and opening its SQLAlchemy store take about 2 s, torch about 2 s more,
one after the other in a stage that does both. A stage starts this worker first
(``Tracker.spawn``): the worker imports mlflow and opens the store on one core while the
stage imports torch on the other. The stage then talks to it through ``RemoteRun``,
which has the methods of ``tracking.Run``; calls are JSON lines on the worker's stdin,
executed in order. The worker answers each ``start`` with the run's id, which the stage
reads only when it needs it. One worker serves the runs of a stage one after another (a
stage that evaluates several predictors gives each its own run). When a run ends it is
marked FINISHED or FAILED; if the stage dies without saying (SIGKILL), the worker sees
its stdin close and marks the open run KILLED, and a resumed stage reopens it.

The worker's first answer says whether the store is reachable (an HTTP server is
asked; ``spool.check_reachable``): a stage tracking into a server that is down stops
there, before computing. A call that fails later is not the stage's end: the worker
keeps it and every later call in a spool (``spool``) and the stage goes on.

``python -m bayesavg.tracking.worker URI ARTIFACT_LOCATION [SPOOL_DIR]`` runs the worker.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from ..runtime.entry import STOPS, said_of, stops_held
from . import forks
from .remote_run import RemoteRun

KILLED = "KILLED"  # a run whose stage died without ending it
DIED = "its stage's process ended without ending the run (SIGKILL, or out of memory)"


class TrackingError(RuntimeError):
    """The tracking worker failed (its own error is on stderr above)."""


class Tracker:
    """The stage's side of a tracking worker process."""

    def __init__(self, proc: subprocess.Popen[str] | forks.Forked, tracking_uri: str = "") -> None:
        self._proc = proc
        self.tracking_uri = tracking_uri
        self._ready: dict[str, Any] | None = None  # the worker's first answer
        self._started = 0  # runs started: the worker answers each start with its id
        self._ids: list[str] = []  # the answers read so far, in order

    @classmethod
    def spawn(
        cls, tracking_uri: str, artifact_location: str, spool_dir: str | Path | None = None
    ) -> Tracker:
        """Start a worker; ``spool_dir``: where calls that cannot be sent are kept. Under
        ``scripts/repro.py`` it is forked from a warm server (``forks``), else spawned."""
        args = [tracking_uri, artifact_location]
        args += [str(spool_dir)] if spool_dir is not None else []
        forked = forks.request(args)
        if forked is not None:
            return cls(forked, tracking_uri)
        with stops_held():  # the worker ignores them from its start on (``main``)
            command = [sys.executable, "-m", "bayesavg.tracking.worker", *args]
            pipe = subprocess.PIPE
            return cls(subprocess.Popen(command, stdin=pipe, stdout=pipe, text=True), tracking_uri)

    def unreachable(self) -> str | None:
        """Why the store cannot be reached (one line), or None: waits for the worker's
        first answer, its check of an HTTP server (at most ~12 s)."""
        if self._ready is None:
            self._ready = self.receive()
        error = self._ready.get("error")
        return str(error) if error else None

    def send(self, op: str, **fields: Any) -> None:
        assert self._proc.stdin is not None
        if self._proc.stdin.closed:  # the worker has ended (``_failure``) or was closed
            raise TrackingError(self._failure())
        try:
            self._proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise TrackingError(self._failure()) from None

    def receive(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = "" if self._proc.stdout.closed else self._proc.stdout.readline()
        if not line:
            raise TrackingError(self._failure())
        return json.loads(line)

    def started(self) -> int:
        """Start a run (the ``start`` op's fields); its index among this worker's runs."""
        self._started += 1
        return self._started - 1

    def run_id(self, index: int) -> str:
        """The id of run ``index``: waits until the worker has opened it."""
        problem = self.unreachable()
        if problem is not None:
            raise TrackingError(problem)
        while len(self._ids) <= index:
            self._ids.append(str(self.receive()["run_id"]))
        return self._ids[index]

    def _failure(self) -> str:
        code = self._proc.wait()
        self._release()
        return f"the MLflow tracking worker stopped (exit code {code}); its error is above"

    def discard(self) -> None:
        """Stop a worker that will not be used (its stage hands the work to other processes)."""
        self._proc.kill()
        self._proc.wait()
        self._release()

    def close(self) -> None:
        """Let the worker finish what it was sent, and wait for it."""
        self._release(self._proc.stdin)  # what tells the worker to finish
        code = self._proc.wait()
        self._release()  # its answers only now: one it writes late must not find the pipe gone
        if code != 0:
            raise TrackingError(self._failure())

    def _release(self, *pipes: IO[str] | None) -> None:
        """Close this side of ``pipes`` (default both): one left to the collector warns."""
        for pipe in pipes or (self._proc.stdin, self._proc.stdout):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()

    @contextlib.contextmanager
    def run(
        self,
        run_name: str,
        *,
        experiment: str,
        tags: Mapping[str, str],
        inputs: Mapping[str, str],
        resume: str | None = None,
        start_time: int | None = None,
        parent: Mapping[str, str] | None = None,
        close: bool = True,
    ) -> Iterator[RemoteRun]:
        """Start a run in the worker, yield it, end it FINISHED (on an exception FAILED, on
        an interruption KILLED).

        ``start_time`` (ms since the epoch): when the stage started, so the run's
        duration in MLflow covers the stage, not only the part after the worker
        was ready. ``close``: wait for the worker to finish and stop after a
        FINISHED run; without it the worker goes on serving the stage's next run,
        and the stage calls ``close`` at its end. A FAILED run always closes.
        """
        self.send(
            "start",
            run_name=run_name,
            experiment=experiment,
            tags=dict(tags),
            inputs=dict(inputs),
            resume=resume,
            start_time=start_time,
            parent=dict(parent) if parent else None,
        )
        run = RemoteRun(self, self.started())
        try:
            yield run
        except BaseException as err:
            with contextlib.suppress(TrackingError):
                self.send("end", status=ended_status(err), why=said_of(err))
                self.close()
            raise
        _ = run.run_id  # known to the stage after the worker is gone (the run id file)
        self.send("end", status="FINISHED")
        if close:
            self.close()


def serve(
    tracking_uri: str,
    artifact_location: str,
    stdin: IO[str],
    stdout: IO[str],
    spool_dir: Path | None = None,
) -> int:
    """The worker: check the store, open it, replay what earlier stages could not send,
    then carry out the stage's calls until stdin closes; return the exit code.

    The first answer says whether the store is reachable (``{"ready": ...}``): a stage
    tracking into an HTTP server waits for it before computing anything (exit code 2,
    the one-line reason in ``error``). A call that fails later sends it and every later
    call to a spool under ``spool_dir`` instead (``spool``), and the stage goes on.
    """
    from .spool import Spool, bound_retries, check_reachable, load_ids, replay_pending, resolve

    bound_retries()
    problem = check_reachable(tracking_uri)
    _answer(stdout, {"ready": problem is None, "error": problem})
    if problem is not None:
        return 2
    # Importing mlflow and opening its store create ~10^6 long-lived objects and no
    # garbage: collecting during the import, or walking them all in the first full
    # collection after it (~0.2 s each), only delays the stage: they are frozen.
    gc.disable()
    from . import system_metrics
    from .store import open_run, warm_store

    warm_store(tracking_uri)
    gc.freeze()
    gc.enable()
    if spool_dir is not None:
        replay_pending(spool_dir, tracking_uri, artifact_location)
    ids = load_ids(spool_dir) if spool_dir is not None else {}
    run = None
    index = -1  # this worker's runs, counted from 0
    name = ""
    ended = failed = False  # failed: a run of this stage ended otherwise than FINISHED
    spool: Spool | None = None
    watch = None  # the run's system metrics monitor, when asked for
    for line in stdin:
        msg = resolve(json.loads(line), ids)  # runs the replay has created since
        op = msg.pop("op")
        if op == "start":
            index, ended, name = index + 1, False, msg["run_name"]
        if spool is None:
            try:
                if op == "start":
                    run = open_run(
                        msg["run_name"],
                        tracking_uri=tracking_uri,
                        artifact_location=artifact_location,
                        **{k: v for k, v in msg.items() if k != "run_name"},
                    )
                    _answer(stdout, {"run_id": run.run_id})
                    watch = system_metrics.start(run.run_id, tracking_uri, bool(msg.get("resume")))
                elif op == "end":
                    assert run is not None
                    system_metrics.stop(watch)
                    run.terminate(**msg)
                    ended = True
                else:
                    assert run is not None
                    getattr(run, op)(**msg)
                continue
            except Exception as err:  # the store failed: spool this call and the rest
                system_metrics.stop(watch)
                cause = f"{type(err).__name__}: {err}".splitlines()[0][:300]
                spool = Spool.open(spool_dir or Path("runs/spool"), tracking_uri, cause)
                if run is not None and op != "start":
                    spool.attach(index, run.run_id)
        spool.add(index, op, msg)
        if op == "start":
            _answer(stdout, {"run_id": spool.placeholder(index)})
        ended = ended or op == "end"
        failed = failed or (op == "end" and msg["status"] != "FINISHED")
    if spool is not None:
        if index >= 0 and not ended:
            dead = {"stage": name, "reused": None, "status": KILLED, "why": DIED}
            spool.add(index, "record_in_parent", dead)
            spool.add(index, "end", {"status": KILLED, "why": DIED})
        written = "" if failed or (index >= 0 and not ended) else "its outputs are written, and "
        sys.stderr.write(
            f"warning: MLflow tracking at {tracking_uri} failed during this stage "
            f"({_cause(spool)}); {written}{spool.calls} tracking "
            f"calls are kept in {spool.path}: the next stage that reaches the server "
            "sends them, or run `bayesavg track --sync`\n"
        )
    elif run is not None and not ended:  # the stage died without ending its run
        system_metrics.stop(watch)
        with contextlib.suppress(Exception):
            run.record_in_parent(name, None, KILLED, why=DIED)
        run.terminate(KILLED, DIED)
    return 0


def _cause(spool: Any) -> str:
    with spool.path.open(encoding="utf-8") as f:
        return str(json.loads(f.readline())["cause"])


def _answer(stdout: IO[str], message: Mapping[str, Any]) -> None:
    with contextlib.suppress(BrokenPipeError):  # a stage stopped in its imports has gone
        stdout.write(json.dumps(message) + "\n")
        stdout.flush()


def ended_status(err: BaseException) -> str:
    """An interrupted run (Ctrl-C, SIGTERM: ``KeyboardInterrupt``) was KILLED, not FAILED."""
    return KILLED if isinstance(err, KeyboardInterrupt) else "FAILED"


def main() -> None:
    # Ctrl-C or a SIGTERM to the process group (a timeout, a cancelled CI job) reaches
    # this worker too, blocked since its spawn (``stops_held``): the stage decides; the
    # worker ends when the stage's pipe closes (the run KILLED if the stage died).
    for stop in STOPS:
        signal.signal(stop, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    uri, artifacts = sys.argv[1:3]
    spool_dir = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    # Before mlflow is imported: its INFO lines ("Validating input example ...") and
    # download progress bars, one set per logged model, would fill the stage's output;
    # warnings and errors still show. Either variable set by the user is kept.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # Answers go over a private copy of stdout; anything mlflow or its
    # libraries print goes to stderr, so it cannot corrupt the answers.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    code = serve(uri, artifacts, sys.stdin, answers, spool_dir)  # each answer flushed
    # Every call has been carried out and committed; finalising mlflow's and
    # SQLAlchemy's module graphs would keep the stage waiting ~0.8 s more.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
