"""What every stage shares: project root, params, the MLflow run (checkpoints: ``_checkpoint``).

This and ``_execution`` (which DVC process runs the stage) are the only places
that know about DVC (its env vars, processes and workspaces); the library under
src/ does not. ``_bootstrap``, imported first, has already started the MLflow
tracking worker; stages import torch-heavy modules inside ``run()`` so that they
load while the worker starts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import _bootstrap  # first: the environment check, and the tracking worker started
import yaml
from _execution import execution
from _sets import _Ledger, reused_runs, run_file

from bayesavg.config import Params, load_params
from bayesavg.runtime import launch, numerics
from bayesavg.runtime.entry import leave_on_stop, run_entry, said_of, stops_deferred
from bayesavg.runtime.errors import UserError
from bayesavg.runtime.io import sha256_file, write_csv, write_json
from bayesavg.tracking.source import default_store, git_commit, source_tags
from bayesavg.tracking.spool import is_remote
from bayesavg.tracking.worker import Tracker, ended_status

PARAMS = Path("params.yaml")
PREPARED = Path("data/prepared")
MANIFEST = PREPARED / "manifest.json"
CHECKPOINTS = Path("checkpoints")
STAGES = Path(__file__).resolve().parent


project_root = _bootstrap.project_root
spool_dir = _bootstrap.spool_dir


def main(fn: Callable[[], None]) -> None:
    """Run a stage: a ``UserError`` is one line and exit code 2. As one rank of a torchrun
    job (``delegated``), a failure is recorded for the launcher, which reports the first."""
    if launch.is_rank():
        code = launch.rank_entry(fn)
        if not code:
            _finish_tracking()
        _leave(code)
    try:
        run_entry(fn)
    except SystemExit as stop:
        _leave(stop.code)
    _finish_tracking()
    _leave(0)


def delegated(compute: Callable[[], object]) -> bool:
    """For a distributed stage: whether this process has nothing more to do.

    Outside torchrun with ``BAYESAVG_NPROC`` > 1, it runs this stage's command on
    that many processes (torchrun) and waits; its own tracking worker is stopped,
    since rank 0 of the job tracks and writes. As a rank other than 0 it runs
    ``compute`` (its share of the work) and writes nothing. Rank 0, or a single
    process, goes on with the stage.
    """
    if launch.should_relaunch():
        if _bootstrap.tracker is not None:
            _bootstrap.tracker.discard()
            _bootstrap.tracker = None
        launch.relaunch(sys.argv)
        return True
    if not launch.is_main_rank():
        compute()
        return True
    return False


def _leave(code: object) -> None:
    """Exit without finalising the interpreter: tearing down torch's module graph takes
    about 0.6 s at every stage's exit. By now every output is written and closed (atomic
    writes) and the tracking worker has finished, so there is nothing left to flush but
    the logs and the standard streams. An unexpected exception does not come here: it
    ends the process the normal way, with its traceback."""
    logging.shutdown()
    for folder in _scratch:
        shutil.rmtree(folder, ignore_errors=True)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def params() -> Params:
    return load_params(PARAMS)


class PredictorFiles(NamedTuple):
    """What stage evaluate@<trajectory> writes for one of its predictors."""

    metrics: Path
    reliability: Path
    samples: Path
    predictions: Path


def predictor_files(trajectory: str, name: str) -> PredictorFiles:
    """A predictor's files: in its trajectory's folders, which are the stage's outputs."""
    return PredictorFiles(
        metrics=Path("metrics/evaluate") / trajectory / f"{name}.json",
        reliability=Path("plots/reliability") / trajectory / f"{name}.csv",
        samples=Path("plots/samples") / trajectory / f"{name}.csv",
        predictions=Path("predictions") / trajectory / f"{name}.npz",
    )


_scratch: list[Path] = []


def scratch() -> Path:
    """A private folder for files the tracking worker reads after the run that sent them
    ended (it serves the process's runs until the stage's last line); removed then."""
    if not _scratch:
        _scratch.append(Path(tempfile.mkdtemp(prefix="bayesavg-stage-")))
    return _scratch[0]


def raw_params() -> dict[str, Any]:
    return yaml.safe_load(PARAMS.read_text(encoding="utf-8"))


# Wall-clock columns of a training history: MLflow gets them (``log_history``), the
# DVC outputs do not, since their bytes must be what any rerun reproduces.
CLOCK_COLUMNS = ("seconds", "compile_seconds")


def write_history(path: Path, history: Sequence[Mapping[str, float]]) -> None:
    """A training history as a DVC plot file: every column but the wall clock."""
    write_csv(path, [{k: v for k, v in row.items() if k not in CLOCK_COLUMNS} for row in history])


_digests: dict[Path, str] = {}


def digest(path: Path) -> str:
    """sha256 of a stage input or output file, computed once per process; a missing input
    (an upstream stage interrupted, or this one run by hand first) is one line."""
    if path not in _digests:
        if not path.is_file():
            raise UserError(
                f"{path} is missing: run the stage that writes it first (dvc repro runs "
                "what a stage needs)"
            )
        _digests[path] = sha256_file(path)
    return _digests[path]


@contextlib.contextmanager
def tracked(
    stage: str,
    p: Params,
    logged: Mapping[str, Any],
    inputs: Sequence[Path] = (),
    id_file: Path | None = None,
    resume: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> Iterator[Any]:
    """An MLflow run named ``stage``, the DVC stage's name or, in a stage of several units
    (the predictors of one trajectory, the landscape probes), the unit's; its id goes to
    ``id_file``.

    ``id_file`` defaults to ``runs/<stage>.json``: the workspace's ledger of the
    runs that made its outputs, which a stage DVC skips keeps. It is not a DVC
    output: a run id and timings change with every execution, and every DVC
    output's bytes must be what a rerun on another machine reproduces.
    ``inputs``: files this stage reads that earlier stages wrote; the run
    is tagged ``upstream.<stage>`` with the run that wrote those very bytes.
    ``resume``: a run id to continue (from a checkpoint). ``tags``: more tags
    (``dvc_stage`` is the DVC stage's name, from ``DVC_STAGE``).
    The run file also records where the time went: ``startup`` (from the
    process's first line, or the previous run's end, to this run's work:
    imports, params, inputs), ``compute`` (the body of this block) and, for
    the process's last run, ``finish`` (waiting for the tracking worker).
    One worker serves a process's runs one after another.
    """
    if _bootstrap.tracker is None:
        _bootstrap.tracker = Tracker.spawn(*default_store(project_root()), spool_dir())
    tracker = _bootstrap.tracker
    if is_remote(tracker.tracking_uri):  # a server down now: one line, nothing computed
        problem = tracker.unreachable()
        if problem is not None:
            raise UserError(problem)
    commit = git_commit(Path.cwd())
    run_tags = {
        **source_tags(sys.argv[0], commit),
        "git_commit": commit,
        "dvc_stage": os.environ.get("DVC_STAGE") or stage,
        "seed": str(p.seed),
        # only under `dvc exp run` (an empty tag is noise in the UI's tag column)
        **{
            tag: os.environ[env]
            for tag, env in (
                ("dvc_exp_name", "DVC_EXP_NAME"),
                ("dvc_exp_baseline_rev", "DVC_EXP_BASELINE_REV"),
            )
            if os.environ.get(env)
        },
        "command": " ".join(sys.argv),
        # what the bytes depend on besides params and code (torch stages only)
        **(
            {f"numerics.{k}": v for k, v in numerics.describe().items()}
            if "torch" in sys.modules
            else {}
        ),
        **(tags or {}),
    }
    parent = execution()
    with contextlib.ExitStack() as tail:
        with tracker.run(
            stage,
            experiment=p.tracking.experiment,
            tags=run_tags,
            inputs={str(path): digest(path) for path in inputs},
            resume=resume,
            start_time=int(_Ledger.since_at * 1000),
            parent=parent,
            close=False,
        ) as run:
            try:
                started = _opened(run, run_tags["dvc_stage"], p, logged, inputs)
                yield run
            except BaseException as err:
                rolled_back = dict(_Ledger.units or {})  # the set's units going with it
                if parent is not None or rolled_back:
                    said = said_of(err)
                    run.record_in_parent(
                        stage, reused_runs(stage), ended_status(err), rolled_back, said
                    )
                if _Ledger.units:
                    _Ledger.units.clear()  # said: ``one_set`` has nothing more to say
                raise
            # From here to the ledger's entry a stop waits: the run ends FINISHED with its
            # entry and, in a set, among the units a later failure marks rolled back.
            tail.enter_context(stops_deferred())
            done = time.perf_counter()
            seconds = {"startup": started - _Ledger.since, "compute": done - started}
            run.log_metrics({f"stage_{k}_seconds": v for k, v in seconds.items()})
            if parent is not None:
                run.record_in_parent(stage, reused_runs(stage), "FINISHED", {})
        record = {
            "run_id": run.run_id,
            "stage": stage,
            "dvc_stage": run_tags["dvc_stage"],
            "experiment": p.tracking.experiment,
            "seconds": {**seconds, "finish": 0.0},
        }
        path = id_file or run_file(stage)
        write_json(path, record)
        _Ledger.last = (path, record)
        if _Ledger.units is not None:
            _Ledger.units[stage], _Ledger.unit_run = run.run_id, run
        _Ledger.since, _Ledger.since_at = time.perf_counter(), time.time()


def _opened(
    run: Any, dvc_stage: str, p: Params, logged: Mapping[str, Any], inputs: Sequence[Path]
) -> float:
    """A run's first calls: its params, a killed set's marking, its datasets; returns
    when its body starts."""
    run.log_params({"seed": p.seed, "device": p.device, **logged})
    if _Ledger.killed:
        why = f"its outputs were removed when {dvc_stage} ran again after the "
        why += "execution that made them was killed before the stage's other units ended"
        run.mark_rolled_back(_Ledger.killed, why)
        named = ", ".join(f"{unit} ({rid})" for unit, rid in _Ledger.killed.items())
        print(f"marked MLflow run(s) of a killed set rolled back: {named}", file=sys.stderr)
        _Ledger.killed = {}
    if MANIFEST in inputs:
        run.log_datasets(prepared_datasets(MANIFEST))
    return time.perf_counter()


def _finish_tracking() -> None:
    """Wait for the tracking worker to carry out the process's last calls; the time goes
    to the last run's id file as its ``finish``."""
    leave_on_stop(_leave)  # the work is done: a stop now ends the wait (exit code 0)
    tracker, _bootstrap.tracker = _bootstrap.tracker, None
    if tracker is None:
        return
    waited = time.perf_counter()
    tracker.close()
    if _Ledger.last is not None:
        path, record = _Ledger.last
        record["seconds"]["finish"] = time.perf_counter() - waited
        with stops_deferred():  # a stop leaves after the write, not with half of it
            write_json(path, record)


def prepared_datasets(manifest: Path) -> list[dict[str, str]]:
    """The prepared splits as MLflow dataset inputs: name, the sha256 the manifest records
    for the split's file, where it lies, the split as context; a damaged manifest: one line."""
    try:
        found = json.loads(manifest.read_text())
        return [
            {
                "name": f"{found['dataset']}-{split}",
                "digest": entry["sha256"],
                "source": str((manifest.parent / entry["file"]).resolve()),
                "context": split,
                "profile": json.dumps(
                    {"num_rows": entry["n"], "per_class": entry.get("per_class")}
                ),
            }
            for split, entry in found["splits"].items()
        ]
    except (OSError, ValueError, LookupError, TypeError, AttributeError) as err:
        raise UserError(f"cannot read {manifest} ({err!r}); rerun the data stage") from None


def mark_outputs(run: Any, paths: Sequence[Path]) -> None:
    """Tag ``run`` with the digests of the files it wrote, for later stages to link to."""
    _digests.update({path: sha256_file(path) for path in paths})
    run.mark_outputs({str(path): _digests[path] for path in paths})
