"""A started MLflow run and what a stage logs into it; ``store`` opens runs. These two are
the only modules that import mlflow.

One run per stage execution. Metrics go through ``log_batch`` (one call per
metric costs milliseconds each); the client API is used instead of the
fluent one so no global "active run" leaks between stages or tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .registry import register_best
from .serialized import serialized

OUTPUT_TAG = "bayesavg.output."
# A pipeline execution's parent run: found by this tag's value (the execution's key);
# PIPELINE_TAG holds, as JSON, the stages that ran in it and those it reused.
EXECUTION_TAG = "bayesavg.execution"
PIPELINE_TAG = "bayesavg.stages"
PARENT_TAG = "mlflow.parentRunId"
# On the run that stores a file's bytes: STORED_TAG + sha256 -> the artifact's path.
STORED_TAG = "bayesavg.stored."
# Why another process ended a run it found orphaned (``orphans``); dropped if the run's
# own end arrives after all (a spool replayed once the tracking server answers again).
ENDED_TAG = "bayesavg.ended"
# On a unit's FINISHED run whose outputs its stage's later failure removed (a stage that
# writes its units all or none): why they are gone.
ROLLED_BACK_TAG = "bayesavg.rolled_back"
NOTE_TAG = "mlflow.note.content"  # a run's description in the UI
# On a FAILED or KILLED run: why, in the one line its stage ended with.
FAILURE_TAG = "bayesavg.failure"
_MAX_METRICS = 1000
_MAX_PARAMS = 100
_MAX_PARAM_CHARS = 6000


# Metric names MLflow's UI groups into one chart section: train_loss -> train/loss.
_GROUPED_PREFIXES = ("avg_test_", "train_", "val_", "test_", "stage_")


def metric_key(name: str) -> str:
    """``<split>_<metric>`` as ``<split>/<metric>``, the ``/`` grouping the UI's charts use;
    names already grouped, or with no known prefix, are kept."""
    for prefix in _GROUPED_PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return f"{prefix[:-1]}/{name[len(prefix) :]}"
    return name


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{key}."))
        else:
            out[key] = str(v)[:_MAX_PARAM_CHARS]
    return out


class Run:
    """A started MLflow run: log params, metric histories, artifacts."""

    def __init__(self, client: Any, run_id: str, tracking_uri: str | None = None) -> None:
        self._client = client
        self.run_id = run_id
        self.tracking_uri = tracking_uri

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in _flatten(params).items()]
        for i in range(0, len(items), _MAX_PARAMS):
            self._client.log_batch(self.run_id, params=items[i : i + _MAX_PARAMS])

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        self.log_history([{"step": step, **metrics}], step_key="step")

    def log_history(
        self, rows: Sequence[Mapping[str, float]], step_key: str = "epoch", prefix: str = ""
    ) -> None:
        """Each row's numbers as metrics at step ``row[step_key]``, batched."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [
            Metric(f"{prefix}{metric_key(k)}", float(v), now, int(row[step_key]))
            for row in rows
            for k, v in row.items()
            if k != step_key and isinstance(v, int | float)
        ]
        for i in range(0, len(items), _MAX_METRICS):
            self._client.log_batch(self.run_id, metrics=items[i : i + _MAX_METRICS])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self._client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self._client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self._client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact_once(self, path: str | Path, artifact_path: str, digest: str) -> str:
        """Store ``path`` under ``artifact_path`` unless a run of this experiment already
        stores the same bytes (sha256 ``digest``); either way tag this run with where they
        are (``stored_at``, a ``runs:/`` URI, returned). A forced rerun that rewrites
        identical posteriors then adds nothing to the artifact store."""
        client = self._client
        exp_id = client.get_run(self.run_id).info.experiment_id
        uri = _stored(client, exp_id, digest)
        if uri is None:
            self.log_artifact(path, artifact_path)
            relative = f"{artifact_path}/{Path(path).name}"
            self.set_tags({f"{STORED_TAG}{digest}": relative})
            uri = f"runs:/{self.run_id}/{relative}"
        self.set_tags({"stored_at": uri})
        return uri

    def log_datasets(self, datasets: Sequence[Mapping[str, str]]) -> None:
        """Dataset inputs the UI's Datasets column shows: each a mapping with ``name``,
        ``digest`` (of the data's bytes; MLflow keeps 36 characters), ``source`` (where the
        data lies) and ``context`` (``train``, ``val``, ``test``). Built as entities, not
        through ``mlflow.data``, which would hash and profile the arrays again."""
        import json

        from mlflow.entities import Dataset, DatasetInput, InputTag

        self._client.log_inputs(
            self.run_id,
            datasets=[
                DatasetInput(
                    Dataset(
                        name=d["name"],
                        digest=d["digest"][:36],
                        source_type="local",
                        source=json.dumps({"uri": d["source"]}),
                        profile=d.get("profile"),
                    ),
                    tags=[InputTag("mlflow.data.context", d["context"])],
                )
                for d in datasets
            ],
        )

    def mark_outputs(self, digests: Mapping[str, str]) -> None:
        """Tag the run with the sha256 of each output it wrote (``OUTPUT_TAG`` + path),
        so a later run that reads those bytes can find this one (``store._upstream``)."""
        self.set_tags({f"{OUTPUT_TAG}{path}": digest for path, digest in digests.items()})

    def terminate(self, status: str = "FINISHED", why: str | None = None) -> None:
        """End the run: FINISHED, FAILED or KILLED. ``why`` (a FAILED or KILLED run's one
        line) goes in ``FAILURE_TAG`` and leads its description: without it the UI shows
        a failed run and not what the stage said."""
        if why:
            note = self._noted_first(self.run_id, f"{status.capitalize()}: {why}")
            self.set_tags({FAILURE_TAG: why, NOTE_TAG: note})
        self._client.set_terminated(self.run_id, status=status)
        _unsweep(self._client, self.run_id)

    def log_model(
        self,
        name: str,
        posterior: str,
        digest: str,
        config: Mapping[str, Any],
        input_shape: Sequence[int],
        num_classes: int,
        example: Sequence[Any],
        code: str,
        bn_images: str | None = None,
    ) -> str:
        """Log the predictor as an MLflow pyfunc model (``bayesavg.mlflow_model``) linked to
        this run; returns its model id.

        The posterior is not stored again when a run of this experiment already stores
        these bytes (``digest``; the finetune stage's ``log_artifact_once``): the model
        then points at them (``posterior_uri``). The signature is
        given, so MLflow neither infers requirements nor runs the model to log it.
        ``code``: the model's code file (``bayesavg.predict.MODEL_CODE``), stored as is.
        """
        import tempfile

        import mlflow
        import numpy as np
        from mlflow.entities import LoggedModelOutput
        from mlflow.models import ModelSignature
        from mlflow.types.schema import Schema, TensorSpec

        client = self._client
        exp_id = client.get_run(self.run_id).info.experiment_id
        stored = _stored(client, exp_id, digest)
        config = dict(config)
        artifacts = {} if bn_images is None else {"bn_images": bn_images}
        if stored is not None:
            config["posterior_uri"] = stored
        else:
            artifacts["posterior"] = posterior
        f64, i64 = np.dtype("float64"), np.dtype("int64")
        signature = ModelSignature(
            inputs=Schema([TensorSpec(np.dtype("uint8"), (-1, *input_shape))]),
            outputs=Schema(
                [
                    TensorSpec(f64, (-1, num_classes), "probabilities"),
                    TensorSpec(i64, (-1,), "predicted_class"),
                    TensorSpec(f64, (-1,), "entropy"),
                    TensorSpec(f64, (-1,), "mutual_info"),
                ]
            ),
        )
        model = client.create_logged_model(
            exp_id,
            name=name,
            source_run_id=self.run_id,
            params={k: str(v) for k, v in config.items()},
            model_type="bayesavg-posterior",
        )
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "model"
            mlflow.pyfunc.save_model(
                local,
                python_model=code,
                artifacts=artifacts or None,
                model_config=config,
                signature=signature,
                input_example=np.asarray(example, dtype=np.uint8),
                pip_requirements=_requirements(),
            )
            client.log_model_artifacts(model.model_id, str(local))
        client.finalize_logged_model(model.model_id, "READY")
        client.log_outputs(self.run_id, [LoggedModelOutput(model.model_id, 0)])
        return model.model_id

    def register_best(self, name: str, candidates: Mapping[str, Mapping[str, Any]]) -> None:
        """``register_best`` in this run's store, and tag this run with what it registered."""
        assert self.tracking_uri is not None
        version = register_best(self._client, self.tracking_uri, name, candidates)
        self.set_tags({"registered_model": f"models:/{name}/{version}"})

    def record_in_parent(
        self,
        stage: str,
        reused: Mapping[str, str] | None,
        status: str,
        rolled_back: Mapping[str, str] | None = None,
        why: str | None = None,
        between_units: bool = False,
    ) -> None:
        """Tell this run's parent (its pipeline execution) that ``stage`` ran here with
        ``status`` (``why``: the line a stage that did not finish ended with), which stages
        it reused (stage -> the run that made their outputs; None: as recorded before), and
        end it: FINISHED only while every stage of the execution has finished, else the
        first other status a stage ended with.
        ``rolled_back``: units (name -> run) whose outputs went with this failed one's;
        each run is tagged ``ROLLED_BACK_TAG``, with or without a parent.
        ``between_units``: ``stage``, this unit's DVC stage, failed outside its units' runs.

        Stages of one execution may run side by side (``scripts/repro.py``): this
        read-modify-write of the parent's summary holds the parent's lock, so each
        stage rewrites it whole from the last one's, and the last leaves it complete.
        """
        if rolled_back:
            gone = f"its outputs were removed when {stage}, of the same stage, ended {status}"
            if between_units:
                gone = f"its outputs were removed when its stage, {stage}, ended {status}"
            self.mark_rolled_back(rolled_back, gone)
        parent = self._client.get_run(self.run_id).data.tags.get(PARENT_TAG)
        if parent is None:
            return
        with serialized(self.tracking_uri or "", parent):
            ran = {} if between_units else {stage: self.run_id}
            self._record(parent, stage, ran, reused, status, list(rolled_back or ()), why)

    def mark_rolled_back(self, runs: Mapping[str, str], why: str) -> None:
        """Tag each of ``runs`` (unit -> run), FINISHED of outputs that are gone,
        ``ROLLED_BACK_TAG``: ``why`` (the stage writes all or none); its description, which
        the UI shows on the run's page, says so first."""
        why = f"{why}: the stage writes all or none"
        for run_id in runs.values():
            self._client.set_tag(run_id, ROLLED_BACK_TAG, why)
            note = self._noted_first(run_id, f"Rolled back: {why}.")
            self._client.set_tag(run_id, NOTE_TAG, note)

    def _noted_first(self, run_id: str, line: str) -> str:
        """``run_id``'s description with ``line`` on top (what the UI shows first)."""
        described = self._client.get_run(run_id).data.tags.get(NOTE_TAG)
        return line + (f"\n\n{described}" if described else "")

    def _record(
        self,
        parent: str,
        stage: str,
        here: Mapping[str, str],
        reused: Mapping[str, str] | None,
        status: str,
        rolled_back: list[str],
        why: str | None,
    ) -> None:
        """``record_in_parent``'s read-modify-write, under the parent's lock."""
        import json

        found = json.loads(self._client.get_run(parent).data.tags.get(PIPELINE_TAG, "{}"))
        ran = {**found.get("ran", {}), **here}
        if reused is None:
            reused = found.get("reused", {})
        failed = {**found.get("failed", {})}
        reasons = {**found.get("why", {})}
        if status != "FINISHED" and stage not in failed:
            failed[stage] = status
            if why:
                reasons[stage] = why
        rolled = sorted({*found.get("rolled_back", []), *rolled_back})
        status = next(iter(failed.values()), status)
        kept = {k: v for k, v in sorted(reused.items()) if k not in ran}
        note = [f"Ran {len(ran)} stage(s): {', '.join(ran)}."]
        if failed:  # before the reused stages' long list, which the UI folds
            said = (
                f"{k} ({v}: {reasons[k]})" if k in reasons else f"{k} ({v})"
                for k, v in failed.items()
            )
            note.append("Did not finish: " + "; ".join(said) + ".")
        if rolled:
            note.append(
                f"Rolled back: {', '.join(rolled)} (finished, but their outputs were "
                "removed when their stage did not finish)."
            )
        if kept:
            note.append(
                f"Reused {len(kept)} stage(s) DVC skipped; their outputs come from: "
                + "; ".join(f"{k} (run {v})" for k, v in kept.items())
                + "."
            )
        extra = {"failed": failed, **({"why": reasons} if reasons else {})} if failed else {}
        # not sorted: ``failed`` in the order stages ended, its first the parent's status
        summary = json.dumps(
            {"ran": ran, "reused": kept, **extra, **({"rolled_back": rolled} if rolled else {})}
        )
        self._client.set_tag(parent, PIPELINE_TAG, summary)
        self._client.set_tag(parent, NOTE_TAG, " ".join(note))
        self._client.set_terminated(parent, status=status)
        _unsweep(self._client, parent)


def _unsweep(client: Any, run_id: str) -> None:
    """Drop ``ENDED_TAG``: the run was not orphaned, its end was only late."""
    if ENDED_TAG in client.get_run(run_id).data.tags:
        client.delete_tag(run_id, ENDED_TAG)


def _stored(client: Any, experiment_id: str, digest: str) -> str | None:
    """A ``runs:/`` URI of an artifact with sha256 ``digest`` some run stores, or None."""
    key = f"{STORED_TAG}{digest}"
    found = client.search_runs([experiment_id], filter_string=f"tags.`{key}` != ''", max_results=1)
    if not found:
        return None
    return f"runs:/{found[0].info.run_id}/{found[0].data.tags[key]}"


def _requirements() -> list[str]:
    """The model's pip requirements, pinned to what runs here (never inferred: inferring
    loads the model in a subprocess); mlflow-skinny where full mlflow is not installed
    (``TORCH=system``, which has no UI)."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for names in (
        ("mlflow", "mlflow-skinny"),
        ("torch",),
        ("torchvision",),
        ("numpy",),
        ("bayesavg",),
    ):
        for name in names:
            try:
                found.append(f"{name}=={version(name)}")
                break
            except PackageNotFoundError:
                continue
    return found


_CLIENTS: dict[str, Any] = {}


def store_client(tracking_uri: str) -> Any:
    """One client per store and process: creating it opens the store (about 0.7 s)."""
    if tracking_uri not in _CLIENTS:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        _CLIENTS[tracking_uri] = MlflowClient(tracking_uri=tracking_uri)
    return _CLIENTS[tracking_uri]
