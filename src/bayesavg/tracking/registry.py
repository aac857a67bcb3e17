"""The model registry: the pipeline's best predictor as a registered model version.

The report stage's run asks for it (``Run.register_best``) once every predictor's run
has logged its model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any


def register_best(
    client: Any, tracking_uri: str, name: str, candidates: Mapping[str, Mapping[str, Any]]
) -> str:
    """Register the candidate with the lowest ``val_nll`` (each candidate: ``run_id`` of the
    run that logged its model, ``val_nll``) as a new version of registered model ``name``,
    alias ``champion``, unless its model already is the latest version; the registered
    model's description lists every candidate, best first. Returns the version."""
    import mlflow
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(tracking_uri)  # the registry resolves models:/ with the global one
    models = {}
    for pred, info in candidates.items():
        outputs = client.get_run(info["run_id"]).outputs
        found = outputs.model_outputs if outputs is not None else []
        if found:
            models[pred] = (found[-1].model_id, float(info["val_nll"]))
    if not models:
        raise ValueError("no candidate run logged a model")
    ranked = sorted(models.items(), key=lambda kv: kv[1][1])
    best = ranked[0][1][0]
    with contextlib.suppress(MlflowException):  # it exists
        client.create_registered_model(name)
    versions = client.search_model_versions(f"name = '{name}'")
    latest = max(versions, key=lambda v: int(v.version), default=None)
    if latest is not None and latest.source.removeprefix("models:/") == best:
        version = latest.version
    else:
        version = client.create_model_version(
            name,
            f"models:/{best}",
            run_id=client.get_logged_model(best).source_run_id,
            model_id=best,
            tags={"predictor": ranked[0][0]},
        ).version
    client.set_registered_model_alias(name, "champion", str(version))
    lines = [f"{p}: models:/{m} (validation NLL {v:.4f})" for p, (m, v) in ranked]
    client.update_registered_model(
        name, description="Best by validation NLL first. Candidates:\n" + "\n".join(lines)
    )
    return str(version)
