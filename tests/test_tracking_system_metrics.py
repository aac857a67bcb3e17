"""MLflow's system metrics for the stages' runs: MLflow's own switch
(``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING``) reaches runs the tracking worker opens, spawned
by a stage or forked by ``scripts/repro.py``'s server; off, nothing is sampled."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from bayesavg.tracking import forks, system_metrics
from bayesavg.tracking.worker import Tracker

ROOT = Path(__file__).resolve().parents[1]
CPU = "system/cpu_utilization_percentage"
INTERVAL = "0.2"  # seconds between samples (MLflow's default: 10)


@contextlib.contextmanager
def _transport(kind: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Workers spawned by the stage, or forked by a server started with this environment
    (as ``scripts/repro.py`` starts it, in the user's)."""
    monkeypatch.delenv(forks.FORKS_ENV, raising=False)
    if kind == "spawned":
        yield
        return
    sys.path.insert(0, str(ROOT / "scripts"))
    import tracking_forks

    with tracking_forks.serving() as env, monkeypatch.context() as m:
        for key, value in env.items():
            m.setenv(key, value)
        yield


def _run_for(mlflow_store: tuple[str, str], seconds: float, resume: str | None = None) -> str:
    with Tracker.spawn(*mlflow_store).run(
        "finetune@swag", experiment="e", tags={}, inputs={}, resume=resume
    ) as run:
        run.log_metrics({"epoch_loss": 1.0}, step=1)
        run_id = run.run_id
        time.sleep(seconds)
    return run_id


def test_asked_for_a_run_logs_the_machine_s_metrics_as_it_goes(
    mlflow_store: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a worker forked by repro.py's server, which the user's environment reached (a
    spawned worker: the next test)."""
    monkeypatch.setenv(system_metrics.ENABLE, "true")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", INTERVAL)
    with _transport("forked", monkeypatch):
        run_id = _run_for(mlflow_store, 1.5)
    client = MlflowClient(tracking_uri=mlflow_store[0])
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["epoch_loss"] == 1.0
    assert {"system/system_memory_usage_megabytes", "system/disk_usage_percentage"} <= set(
        run.data.metrics
    )
    steps = [m.step for m in client.get_metric_history(run_id, CPU)]
    assert steps == list(range(len(steps))) and len(steps) >= 3, steps


def test_a_resumed_run_s_samples_go_on_from_its_last_step(
    mlflow_store: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(system_metrics.ENABLE, "1")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", INTERVAL)
    with _transport("spawned", monkeypatch):
        run_id = _run_for(mlflow_store, 0.9)
    first = len(MlflowClient(tracking_uri=mlflow_store[0]).get_metric_history(run_id, CPU))
    assert _run_for(mlflow_store, 0.9, resume=run_id) == run_id
    steps = [m.step for m in MlflowClient(mlflow_store[0]).get_metric_history(run_id, CPU)]
    assert first >= 1 and len(steps) > first and steps == list(range(len(steps))), steps


@pytest.mark.parametrize("value", [None, "yes"])  # false, 0: the last test
def test_unless_asked_for_nothing_is_sampled(
    mlflow_store: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    value: str | None,
) -> None:
    """Off, or a value MLflow does not accept: no system metric, and the run is whole; a
    bad value is one warning line."""
    if value is None:
        monkeypatch.delenv(system_metrics.ENABLE, raising=False)
    else:
        monkeypatch.setenv(system_metrics.ENABLE, value)
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", INTERVAL)
    monkeypatch.delenv(forks.FORKS_ENV, raising=False)
    run = MlflowClient(mlflow_store[0]).get_run(_run_for(mlflow_store, 0.5))
    assert run.info.status == "FINISHED" and set(run.data.metrics) == {"epoch_loss"}
    warned = [line for line in capfd.readouterr().err.splitlines() if "warning" in line]
    expected = (
        [f"warning: {system_metrics.ENABLE}='yes' is not true, false, 1 or 0: ignored"]
        if value == "yes"
        else []
    )
    assert warned == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("false", False), ("0", False), ("", False)],
)
def test_the_switch_reads_as_mlflow_reads_it(value: str, expected: bool) -> None:
    assert system_metrics.wanted({system_metrics.ENABLE: value}) is expected


def test_a_bad_value_warns_once_for_the_runs_of_one_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A worker opens each of an evaluate stage's runs in turn: one line, not one a run."""
    for _ in range(3):
        assert system_metrics.wanted({system_metrics.ENABLE: "on"}) is False
    assert capsys.readouterr().err.count("warning:") == 1
