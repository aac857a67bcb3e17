"""MLflow's system metrics for a stage's run, when the user asks MLflow for them.

``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=true`` makes ``mlflow.start_run`` log the
machine's CPU, memory, disk, network and (with ``nvidia-ml-py``) GPU use every
``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` seconds (10) as ``system/...`` metrics, which
the UI shows under "System metrics". The stages' runs are opened by the tracking worker
through ``MlflowClient``, which does not look at that variable, so the worker starts
MLflow's own monitor for each run, a thread of the worker's process, not the stage's.
The monitor logs straight to the store, not through the spool: in an outage its samples
are lost, never a result. Like MLflow's, the figures are the whole machine's: stages
side by side each log the same machine.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

ENABLE = "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """MLflow's reading of the switch (true, false, 1 or 0, in any case). Another value
    costs one warning per process (a worker serves a stage's runs one after another), not
    the stage: MLflow itself would stop the run's start."""
    value = (os.environ if environ is None else environ).get(ENABLE, "false")
    if value.strip().lower() not in ("true", "false", "1", "0"):
        _warn_once(value)
        return False
    return value.strip().lower() in ("true", "1")


@functools.cache
def _warn_once(value: str) -> None:
    sys.stderr.write(f"warning: {ENABLE}={value!r} is not true, false, 1 or 0: ignored\n")


def start(run_id: str, tracking_uri: str, resumed: bool) -> Any | None:
    """MLflow's monitor of ``run_id``, sampling in a thread of this process, or None when
    not asked for or when it cannot start (one warning: the run goes on without it). A
    resumed run's samples go on from its last step."""
    if not wanted():
        return None
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        # its INFO lines (started, stopping, no GPU library) would print on every stage
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        monitor = SystemMetricsMonitor(run_id, resume_logging=resumed, tracking_uri=tracking_uri)
        monitor.start()
    except Exception as err:  # a monitor is never worth a run
        sys.stderr.write(f"warning: no system metrics for this run ({type(err).__name__}: {err})\n")
        return None
    return monitor


def stop(monitor: Any | None) -> None:
    """Stop sampling and send what is collected, before the run ends (the monitor stops
    by itself once it sees the run is no longer RUNNING, with its last samples unsent)."""
    if monitor is not None:
        monitor.finish()
