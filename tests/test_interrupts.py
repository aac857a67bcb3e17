"""An interrupted entry point (Ctrl-C, or SIGTERM from a timeout, a cancelled job or
``kill``): one line, the shell's exit code, ``finally`` blocks run, and its MLflow run
ends KILLED rather than FAILED or left RUNNING; an execution's parent run is RUNNING
again while another of its stages runs."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from bayesavg.runtime.entry import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    Terminated,
    early_interrupts,
    run_entry,
)
from bayesavg.tracking.store import open_run
from bayesavg.tracking.worker import KILLED, Tracker, ended_status, serve


def _status(mlflow_store: tuple[str, str], run_id: str) -> str:
    return MlflowClient(tracking_uri=mlflow_store[0]).get_run(run_id).info.status


def test_ctrl_c_is_one_line_and_exit_130(capsys: pytest.CaptureFixture[str]) -> None:
    def stage() -> None:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop:
        run_entry(stage)
    assert stop.value.code == EXIT_INTERRUPTED == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("interrupted by Ctrl-C (SIGINT): stopped;")


def test_sigterm_runs_finally_blocks_and_exits_143(capsys: pytest.CaptureFixture[str]) -> None:
    cleaned = []
    before = signal.getsignal(signal.SIGTERM)

    def stage() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the handler raises before this ends
        finally:
            cleaned.append(True)

    with pytest.raises(SystemExit) as stop:
        run_entry(stage)
    assert stop.value.code == EXIT_TERMINATED == 143
    assert cleaned == [True]
    assert capsys.readouterr().err.startswith("interrupted by SIGTERM: stopped;")
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_interrupted_run_is_killed_and_a_failed_one_failed(
    mlflow_store: tuple[str, str],
) -> None:
    assert ended_status(KeyboardInterrupt()) == ended_status(Terminated()) == KILLED
    assert ended_status(RuntimeError()) == "FAILED"
    with (
        pytest.raises(Terminated),
        Tracker.spawn(*mlflow_store).run("s", experiment="e", tags={}, inputs={}) as run,
    ):
        run_id = run.run_id
        raise Terminated
    assert _status(mlflow_store, run_id) == KILLED


# A tracked stage in its own process group, waiting to be stopped; its worker is spawned
# in the same group, as a stage's is.
STAGE = """
import sys, time
from bayesavg.runtime.entry import run_entry
from bayesavg.tracking.worker import Tracker

def stage():
    with Tracker.spawn(sys.argv[1], sys.argv[2]).run(
        "finetune@x", experiment="e", tags={}, inputs={}
    ) as run:
        print(run.run_id, flush=True)
        time.sleep(60)

run_entry(stage)
"""


def test_sigterm_to_the_group_leaves_a_killed_run_and_one_line(
    mlflow_store: tuple[str, str],
) -> None:
    """What a timeout or a cancelled CI job does: SIGTERM to every process of the group.
    The worker outlives it (it ignores SIGTERM) to end the run KILLED."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STAGE, *mlflow_store],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    run_id = proc.stdout.readline().strip()
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == EXIT_TERMINATED
    lines = proc.stderr.read().strip().splitlines()
    proc.stdout.close()
    proc.stderr.close()
    assert lines[-1].startswith("interrupted by SIGTERM") and "Traceback" not in "\n".join(lines)
    assert _status(mlflow_store, run_id) == KILLED


def test_the_parent_runs_again_while_another_stage_of_its_execution_runs(
    mlflow_store: tuple[str, str],
) -> None:
    """One stage ended the execution's parent run FINISHED; the next one to start makes it
    RUNNING until it ends; a stage that failed keeps the parent's status FAILED."""
    uri, artifacts = mlflow_store
    parent = {"key": "host:1:2:", "name": "dvc repro now"}

    def stage(name: str) -> object:
        return open_run(
            name, tracking_uri=uri, artifact_location=artifacts, experiment="e", parent=parent
        )

    first = stage("finetune@a")
    first.record_in_parent("finetune@a", {}, "FINISHED")
    first.terminate()
    client = MlflowClient(tracking_uri=uri)
    parent_id = client.get_run(first.run_id).data.tags["mlflow.parentRunId"]
    assert client.get_run(parent_id).info.status == "FINISHED"
    second = stage("finetune@b")
    assert client.get_run(parent_id).info.status == "RUNNING"
    second.record_in_parent("finetune@b", {}, "FAILED")
    second.terminate("FAILED")
    assert client.get_run(parent_id).info.status == "FAILED"
    third = stage("finetune@c")
    assert client.get_run(parent_id).info.status == "FAILED"
    third.record_in_parent("finetune@c", {}, "FINISHED")
    assert client.get_run(parent_id).info.status == "FAILED"


# A stage still importing (torch, its code) when the signal comes: the early handlers.
IMPORTING = """
import sys, time
from bayesavg.runtime.entry import early_interrupts
early_interrupts()
print("importing", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [(signal.SIGINT, 130, "Ctrl-C (SIGINT)"), (signal.SIGTERM, 143, "SIGTERM")],
)
def test_a_signal_during_a_stage_s_imports_is_one_line_and_its_exit_code(
    signum: int, code: int, said: str
) -> None:
    """Not a traceback of the import under way (Ctrl-C), nor a silent death (SIGTERM).
    The stage starts with Ctrl-C handled by default, as from a terminal: started from a
    test run that ignores it (``make test &``, ``nohup``) it would inherit the ignoring,
    which ``early_interrupts`` keeps by design, and never end."""
    proc = subprocess.Popen(
        [sys.executable, "-c", IMPORTING],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None and proc.stdout.readline() == "importing\n"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code
    assert err == (
        f"interrupted by {said}: stopped; run it again (pretrain and fine-tuning stages "
        "resume from their last checkpoint)\n"
    )


# As a stage starts (``stages/_bootstrap.py``): its tracking worker spawned, then imports.
WITH_WORKER = """
import sys, time
from bayesavg.runtime.entry import early_interrupts
early_interrupts()
from bayesavg.tracking.worker import Tracker
Tracker.spawn(sys.argv[1], sys.argv[2])
print("importing", flush=True)
time.sleep(60)
"""


def test_ctrl_c_during_the_imports_is_one_line_from_the_worker_too(
    mlflow_store: tuple[str, str],
) -> None:
    """Ctrl-C reaches the process group: the worker as well, still importing, which
    said a KeyboardInterrupt traceback; or it went on and found the stage gone when it
    answered, a BrokenPipeError traceback. The stage's line is all (stderr is read to
    its end, so the worker, which shares it, has ended too)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WITH_WORKER, *mlflow_store],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the stage and its worker: a terminal's process group
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None and proc.stdout.readline() == "importing\n"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED
    assert err == (
        "interrupted by Ctrl-C (SIGINT): stopped; run it again (pretrain and fine-tuning "
        "stages resume from their last checkpoint)\n"
    )


class _Gone(io.StringIO):
    """The stage's end of the answers pipe, closed: the stage has died."""

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_worker_whose_stage_has_gone_ends_quietly(mlflow_store: tuple[str, str]) -> None:
    """Its answer has no reader (the stage stopped before reading it); its stdin is at
    its end: nothing to record, exit code 0, no BrokenPipeError."""
    assert serve(*mlflow_store, io.StringIO(""), _Gone()) == 0


# A stage whose outputs are written, waiting for its tracking worker's last calls.
FINISHING = """
import os, signal, sys, time
from bayesavg.runtime.entry import early_interrupts, leave_on_stop
early_interrupts()

def leave(code):
    print("left", flush=True)
    os._exit(code)

leave_on_stop(leave)
os.kill(os.getpid(), int(sys.argv[1]))
time.sleep(30)
os._exit(9)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_once_the_work_is_done_ends_the_wait_not_the_stage(signum: int) -> None:
    """Exit code 0 and no line: the outputs are whole and DVC may record them; the
    stop's line (or, from a torchrun rank, a traceback) said the stage had stopped."""
    done = subprocess.run(
        [sys.executable, "-c", FINISHING, str(int(signum))],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "left\n", "")


def test_once_the_entry_runs_ctrl_c_raises_again_so_finally_blocks_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    cleaned = []

    def stage() -> None:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)  # the default handler raises before this ends
        finally:
            cleaned.append(True)

    try:
        # Ctrl-C handled, as from a terminal: a run started ignoring it (``nohup``, ``&``)
        # would pass the ignoring on, which ``early_interrupts`` keeps by design
        signal.signal(signal.SIGINT, signal.default_int_handler)
        early_interrupts()
        early = signal.getsignal(signal.SIGINT)
        with pytest.raises(SystemExit) as stop:
            run_entry(stage)
        assert stop.value.code == 130 and cleaned == [True]
        assert signal.getsignal(signal.SIGINT) is early, "the early handler is back after it"
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])
    assert capsys.readouterr().err.startswith("interrupted by Ctrl-C (SIGINT): stopped;")
