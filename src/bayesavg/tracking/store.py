"""Opening a run in the store: its experiment, its pipeline execution's parent run, a
resumed run, and the links to the runs that wrote its inputs.

What happens before a ``Run`` exists lives here; what a started run logs lives in
``mlflow_run``, so each module reads as one side of a run's life.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from . import orphans
from .mlflow_run import (
    ENDED_TAG,
    EXECUTION_TAG,
    FAILURE_TAG,
    NOTE_TAG,
    OUTPUT_TAG,
    PARENT_TAG,
    ROLLED_BACK_TAG,
    Run,
    store_client,
)
from .serialized import serialized

log = logging.getLogger(__name__)

RESUMED_TAG = "bayesavg.resumed_after"  # how a resumed run's earlier end was marked


def _upstream(client: Any, experiment_id: str, inputs: Mapping[str, str]) -> dict[str, str]:
    """``upstream.<run name>`` -> run id of the newest run that wrote each input's bytes.

    ``inputs`` maps a path to its sha256. The link is by content, so it names
    the run that made the very file read, whichever workspace it ran in.
    """
    links = {}
    for path, digest in inputs.items():
        found = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{OUTPUT_TAG}{path}` = '{digest}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if found:
            links[f"upstream.{found[0].info.run_name}"] = found[0].info.run_id
    return links


def warm_store(tracking_uri: str) -> None:
    """Import mlflow and open the store now, before any run is asked for."""
    store_client(tracking_uri)


# MLflow 3 shows an experiment as GenAI (traces) or model training by this tag; its UI
# 3.x also keeps a per-browser choice, which `make ui`'s URL sets (?workflowType=...).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def _experiment_id(client: Any, name: str, artifact_location: str, tracking_uri: str) -> str:
    """The experiment's id, created if missing; marked as a model-training experiment
    (by one stage at a time: two stages side by side setting the same tag collide in
    MLflow's SQL store)."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            # "" (a tracking server): the server's own artifact store decides
            return client.create_experiment(
                name, artifact_location=artifact_location or None, tags=EXPERIMENT_KIND
            )
        except Exception:
            # Another stage (dvc exp run --queue with jobs) created it meanwhile.
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if any(exp.tags.get(key) != value for key, value in EXPERIMENT_KIND.items()):
        with serialized(tracking_uri, f"experiment\0{name}"):
            exp = client.get_experiment(exp.experiment_id)  # as the last stage left it
            for key, value in EXPERIMENT_KIND.items():
                if exp.tags.get(key) != value:
                    client.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


def open_run(
    run_name: str,
    *,
    tracking_uri: str,
    artifact_location: str,
    experiment: str = "bayesavg",
    tags: Mapping[str, str] | None = None,
    inputs: Mapping[str, str] | None = None,
    resume: str | None = None,
    start_time: int | None = None,
    parent: Mapping[str, str] | None = None,
) -> Run:
    """Create a run (RUNNING), or reopen the run ``resume`` if it still exists.

    ``parent``: the pipeline execution this run belongs to, ``key`` (unique to the
    execution) and ``name``; the run becomes a child of the execution's parent run,
    created by the first stage that asks for it. A reopened run moves to the
    execution that resumed it.

    ``inputs`` (path -> sha256 of files the run reads) adds an
    ``upstream.<stage>`` tag per run that wrote them. Tags are set when the
    run is created: MLflow accepts a DVC stage name (``finetune@swag``) in a
    tag key there, not in ``log_batch``. A reopened run (a stage resumed
    from its checkpoint logs into the run it started) has its tags already.
    ``start_time``: the run's start in ms since the epoch (default: now).

    The run names this process as the one that ends it (``orphans.OWNER_TAG``); the
    first run a process opens in an experiment ends the runs there whose process
    is gone without ending them (``orphans.sweep``).
    """
    client = store_client(tracking_uri)
    exp_id = _experiment_id(client, experiment, artifact_location, tracking_uri)
    if (tracking_uri, exp_id) not in _SWEPT:
        _SWEPT.add((tracking_uri, exp_id))
        swept = orphans.sweep(client, exp_id, tracking_uri)
        if swept:
            log.warning(
                "ended KILLED %d MLflow run(s) left RUNNING by a process that is gone: %s",
                len(swept),
                ", ".join(swept),
            )
    parent_id = None
    if parent:
        # the key as the parent's tag holds it: the lock the sweep takes for the parent
        with serialized(tracking_uri, _execution_key(parent)):
            parent_id = _parent_run(client, exp_id, parent, tags or {})
    run = _resumed(client, resume, exp_id, tracking_uri) if resume else None
    if run is not None:
        with serialized(tracking_uri, run.run_id):  # the lock ``orphans.sweep`` checks under
            client.set_tag(run.run_id, orphans.OWNER_TAG, orphans.owner())
            _running_again(client, run.run_id)
            client.update_run(run.run_id, status="RUNNING")
        if parent_id is not None:
            client.set_tag(run.run_id, PARENT_TAG, parent_id)
        log.info("MLflow run %s (%s) resumed in %s", run.run_id, run_name, tracking_uri)
        return run
    tags = {**(tags or {}), **_upstream(client, exp_id, inputs or {})}
    tags[orphans.OWNER_TAG] = orphans.owner()
    if parent_id is not None:
        tags[PARENT_TAG] = parent_id
    mlflow_run = client.create_run(exp_id, start_time=start_time, run_name=run_name, tags=tags)
    run = Run(client, mlflow_run.info.run_id, tracking_uri)
    log.info("MLflow run %s (%s) in %s", run.run_id, run_name, tracking_uri)
    return run


_SWEPT: set[tuple[str, str]] = set()  # (store, experiment) this process has swept

_SOURCE_TAGS = (
    "mlflow.source.name",
    "mlflow.source.type",
    "mlflow.user",
    "mlflow.source.git.commit",
)


def _parent_run(
    client: Any, experiment_id: str, parent: Mapping[str, str], tags: Mapping[str, str]
) -> str:
    """The id of the execution's parent run, created (named ``parent["name"]``, with the
    child's source tags) if no run has its key yet."""
    key = _execution_key(parent)
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`{EXECUTION_TAG}` = '{key}'", max_results=1
    )
    if found:
        # A unit of the execution ended it FINISHED; another starting runs it again (a
        # stage that failed or was killed keeps that status visible until the end).
        # The last stage to start owns a running parent (``orphans``).
        if found[0].info.status in ("FINISHED", "RUNNING"):
            client.set_tag(found[0].info.run_id, orphans.OWNER_TAG, orphans.owner())
        if found[0].info.status == "FINISHED":
            client.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    own = {k: tags[k] for k in _SOURCE_TAGS if k in tags}
    extra = {k: v for k, v in parent.items() if k not in ("key", "name")}
    run = client.create_run(
        experiment_id,
        run_name=parent["name"],
        tags={EXECUTION_TAG: key, orphans.OWNER_TAG: orphans.owner(), **own, **extra},
    )
    return run.info.run_id


def _execution_key(parent: Mapping[str, str]) -> str:
    """``parent["key"]`` as ``EXECUTION_TAG`` holds it (a quote would end the search's
    string), which also names the parent's lock."""
    return parent["key"].replace("'", "")


def _running_again(client: Any, run_id: str) -> None:
    """Unmark how a resumed run ended before: its page would go on saying "Killed:
    interrupted by SIGTERM" (or "Rolled back: ...") on top of a run that then finishes.
    What it said moves to ``RESUMED_TAG``; the lines it put on the description go."""
    found = client.get_run(run_id)
    tags, status = found.data.tags, found.info.status
    marks = {
        FAILURE_TAG: f"{status.capitalize()}: {tags.get(FAILURE_TAG)}",
        ROLLED_BACK_TAG: f"Rolled back: {tags.get(ROLLED_BACK_TAG)}.",
        ENDED_TAG: str(tags.get(ENDED_TAG)),  # the sweep's, as ``KILLED: ...``
    }
    marks = {tag: line for tag, line in marks.items() if tag in tags}
    if not marks:
        return
    note = tags.get(NOTE_TAG, "")
    while top := next((line for line in marks.values() if line and note.startswith(line)), None):
        note = note[len(top) :].removeprefix("\n\n")  # each on top of the one before
    client.set_tag(run_id, RESUMED_TAG, " ".join(marks.values()))
    if note:
        client.set_tag(run_id, NOTE_TAG, note)
    for tag in [*marks, *([NOTE_TAG] if NOTE_TAG in tags and not note else [])]:
        client.delete_tag(run_id, tag)


def _resumed(client: Any, run_id: str, experiment_id: str, tracking_uri: str) -> Run | None:
    """The run ``run_id`` if it exists in this experiment and is not deleted."""
    from mlflow.exceptions import MlflowException

    try:
        info = client.get_run(run_id).info
    except MlflowException:
        return None
    if info.experiment_id != experiment_id or info.lifecycle_stage != "active":
        return None
    return Run(client, run_id, tracking_uri)
