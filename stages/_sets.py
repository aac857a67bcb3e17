"""A stage's runs/ ledger (which MLflow run made the outputs in this workspace) and its
sets of units that stay all or none (``one_set``): evaluate's predictors, landscape's
probes, the dswag sweep's W, pretrain's two networks.

Kept apart from ``_common`` so that ``tracked`` there and the set's failure path here
share one ledger of finished units without an import circle.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import _bootstrap

from bayesavg.runtime.entry import said_of
from bayesavg.runtime.outputs import all_or_nothing, finish_killed
from bayesavg.tracking.worker import TrackingError, ended_status

RUNS = Path("runs")


def run_file(stage: str) -> Path:
    return RUNS / f"{stage}.json"


class _Ledger:
    """This process's runs, for their id files: when the last one ended, and which one
    waits for the worker's finish."""

    since = _bootstrap.STARTED  # the start of the next run's start-up
    since_at = _bootstrap.STARTED_AT
    last: tuple[Path, dict[str, Any]] | None = None
    units: dict[str, str] | None = None  # in ``one_set``: its finished units' runs by name
    unit_run: Any = None  # in ``one_set``: its last finished unit's run (``RemoteRun``)
    killed: ClassVar[dict[str, str]] = {}  # a killed set's finished units (``one_set``)


@contextlib.contextmanager
def one_set(outputs: Sequence[Path], units: Sequence[str]) -> Iterator[None]:
    """The body runs ``units``, each a tracked run, whose ``outputs`` stay all or none
    (``all_or_nothing``): on a failure what the paths held before is back, the units'
    runs/ ledger entries too (they then name the runs that made what is back), and the
    runs of the units that had finished are marked rolled back in MLflow, since they
    say FINISHED of outputs that are gone. So are those of a set killed before it ended
    (SIGKILL: nothing was left to mark them), whose roll-back finishes here."""
    ledger = {unit: run_file(unit) for unit in units}
    paths = [*outputs, *ledger.values()]
    before = {unit: _ledger_run(path) for unit, path in ledger.items()}
    finish_killed(paths)
    _Ledger.killed = {
        unit: run for unit, run in before.items() if run and run != _ledger_run(ledger[unit])
    }
    _Ledger.units, _Ledger.unit_run = {}, None
    try:
        with all_or_nothing(paths):
            try:
                yield
            except BaseException as err:
                _failed_between_units(err)
                raise
    finally:
        _Ledger.units, _Ledger.unit_run, _Ledger.killed = None, None, {}


def _failed_between_units(err: BaseException) -> None:
    """A set that fails outside its units' runs (a stop or an error between two units, or
    after the last): no unit's run is there to say so (``tracked`` does it for a failure
    inside one), so the last finished unit's run records the stage's end in the execution
    and marks the finished units rolled back. The worker then finishes what it was sent,
    before the roll-back removes files it may still have to log."""
    units, run, tracker = _Ledger.units, _Ledger.unit_run, _bootstrap.tracker
    if not units or run is None or tracker is None:
        return
    stage = os.environ.get("DVC_STAGE") or Path(sys.argv[0]).stem
    with contextlib.suppress(TrackingError):  # the worker's own error is above
        status, why = ended_status(err), said_of(err)
        run.record_in_parent(stage, reused_runs(stage), status, units, why, between_units=True)
        _bootstrap.tracker = None
        tracker.close()


def _ledger_run(path: Path) -> str | None:
    """The run a runs/ ledger entry names (None: no entry, or not one ``tracked`` wrote)."""
    try:
        run = json.loads(path.read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return run if isinstance(run, str) else None


def reused_runs(stage: str) -> dict[str, str]:
    """Every other stage's run as its id file records it (the run that made the outputs in
    this workspace): what an execution reused unless it ran that stage itself.

    The id files are not DVC outputs, so a ``dvc exp run --temp`` or ``--queue``
    workspace holds only those of the stages it ran; the others are the ones its
    baseline reused, recorded in the project's own workspace (``DVC_ROOT``).
    """
    found = {}
    files = sorted(RUNS.glob("*.json"))
    here = {f.name for f in files}
    files += sorted(
        f for f in (_bootstrap.project_root() / RUNS).glob("*.json") if f.name not in here
    )
    for file in files:
        try:
            record = json.loads(file.read_text())
        except (OSError, ValueError):
            continue
        name = record.get("stage")
        if name and name != stage and "run_id" in record:
            found[name] = record["run_id"]
    return found
