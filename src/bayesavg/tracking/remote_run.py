"""The stage's side of a run in the tracking worker (``worker``): ``tracking.Run``'s
methods as calls sent to the worker, which carries them out in the order sent."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol


class _Worker(Protocol):
    """What a run needs of ``worker.Tracker``: sending a call, and the id of run ``index``."""

    def send(self, op: str, **fields: Any) -> None: ...

    def run_id(self, index: int) -> str: ...


class RemoteRun:
    """``tracking.Run``'s methods, carried out by the worker in the order called."""

    def __init__(self, tracker: _Worker, index: int) -> None:
        self._tracker = tracker
        self._index = index

    @property
    def run_id(self) -> str:
        return self._tracker.run_id(self._index)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._tracker.send("log_params", params=_plain(params))

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        self._tracker.send("log_metrics", metrics=dict(metrics), step=step)

    def log_history(
        self, rows: list[Mapping[str, float]], step_key: str = "epoch", prefix: str = ""
    ) -> None:
        self._tracker.send(
            "log_history", rows=[dict(r) for r in rows], step_key=step_key, prefix=prefix
        )

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._tracker.send(
            "log_artifact", path=str(Path(path).resolve()), artifact_path=artifact_path
        )

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._tracker.send("set_tags", tags=dict(tags))

    def log_artifact_once(self, path: str | Path, artifact_path: str, digest: str) -> None:
        self._tracker.send(
            "log_artifact_once",
            path=str(Path(path).resolve()),
            artifact_path=artifact_path,
            digest=digest,
        )

    def log_datasets(self, datasets: list[Mapping[str, str]]) -> None:
        self._tracker.send("log_datasets", datasets=[dict(d) for d in datasets])

    def mark_outputs(self, digests: Mapping[str, str]) -> None:
        self._tracker.send("mark_outputs", digests=dict(digests))

    def log_model(self, **fields: Any) -> None:
        """``tracking.Run.log_model``'s arguments, as JSON-ready values."""
        self._tracker.send("log_model", **_plain(fields))

    def register_best(self, name: str, candidates: Mapping[str, Mapping[str, Any]]) -> None:
        self._tracker.send("register_best", name=name, candidates=_plain(candidates))

    def record_in_parent(
        self,
        stage: str,
        reused: Mapping[str, str],
        status: str,
        rolled_back: Mapping[str, str],
        why: str | None = None,
        between_units: bool = False,
    ) -> None:
        fields = {"reused": dict(reused), "rolled_back": dict(rolled_back), "why": why}
        fields["between_units"] = between_units
        self._tracker.send("record_in_parent", stage=stage, status=status, **fields)

    def mark_rolled_back(self, runs: Mapping[str, str], why: str) -> None:
        self._tracker.send("mark_rolled_back", runs=dict(runs), why=why)


def _plain(value: Any) -> Any:
    """Params as JSON-ready values (tuples as lists; anything else as its text)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
