"""Resumable state of a training run: one file, written atomically, keyed by its inputs.

A checkpoint holds whatever state tree a run hands it (network, optimizer,
collector, RNG states, iteration, history; see ``trajectories``) under a
``key`` that the caller derives from everything that determines the run
(params, input files, code). A file with another key, or one that cannot be
read, or whose bytes fail the zip's CRC-32s (torch's reader does not check
them, so a flipped byte inside a tensor would load as other weights), is
never resumed: it is deleted and the run starts afresh. Loading uses
``weights_only=True``, so a checkpoint holds tensors and plain values only
and never runs code. Opening one also deletes the temp files that a process
killed while saving it left beside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .errors import resumes_from
from .io import remove_stale_temporaries, save_torch, torch_damage

log = logging.getLogger(__name__)

FORMAT = "bayesavg.checkpoint/1"
State = dict[str, Any]


class Resumable(Protocol):
    """What a training run needs of a checkpoint: the state to continue from (None:
    start afresh), when to save and how, and a view for a part of a larger run."""

    @property
    def state(self) -> State | None: ...

    @property
    def active(self) -> bool: ...

    def due(self, epoch: int) -> bool: ...

    def save(self, state: State) -> None: ...

    def nested(self, state: State | None, wrap: Callable[[State], State]) -> Resumable: ...


class Checkpoint:
    """The checkpoint file of one run, saved every ``every`` epochs (0: never).

    ``meta`` is saved beside the state and read back by ``load`` (the MLflow
    run id, so a resumed stage logs into the run it started).
    """

    def __init__(self, path: str | Path, key: str, every: int = 1) -> None:
        if every < 0:
            raise ValueError(f"every must be >= 0, got {every}")
        self.path = Path(path)
        self.key = key
        self.every = every
        self.meta: dict[str, Any] = {}
        self.state: State | None = None

    @property
    def active(self) -> bool:
        return self.every > 0

    def load(self) -> State | None:
        """The saved state (also kept in ``state``) if the file has this key, else None.

        A file with another key, or bytes that are not a checkpoint or not as
        they were saved, is deleted: its run cannot be continued with these
        params and code, or not to the result an uninterrupted run gives.
        """
        self.state = None
        self._sweep()
        if not self.path.is_file():
            return None
        damage = torch_damage(self.path)
        if damage is not None:
            log.warning("checkpoint %s is damaged (%s); starting afresh", self.path, damage)
            self.remove()
            return None
        import torch

        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch's unpickler raises many types on bad bytes
            log.warning("checkpoint %s is unreadable (%s); starting afresh", self.path, err)
            self.remove()
            return None
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            log.warning("%s is not a bayesavg checkpoint; starting afresh", self.path)
            self.remove()
            return None
        if saved.get("key") != self.key:
            log.info("checkpoint %s is from other params, inputs or code; not resumed", self.path)
            self.remove()
            return None
        self.meta = dict(saved.get("meta") or {})
        self.state = saved["state"]
        resumes_from(self.path)
        return self.state

    def due(self, epoch: int) -> bool:
        """Whether a checkpoint is written after ``epoch`` (1-based)."""
        return self.active and epoch % self.every == 0

    def save(self, state: State) -> None:
        """Write the checkpoint, with the CRC-32s that ``load`` checks (``save_torch``)."""
        if self.active:
            tree = {"format": FORMAT, "key": self.key, "meta": self.meta, "state": state}
            save_torch(self.path, tree)
            resumes_from(self.path)

    def nested(self, state: State | None, wrap: Callable[[State], State]) -> Resumable:
        return _Nested(self, state, wrap)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        resumes_from(None)

    def _sweep(self) -> None:
        """Delete the temp files of this checkpoint that a killed save left behind."""
        removed = remove_stale_temporaries(self.path)
        if removed:
            size = sum(n for _, n in removed)
            names = ", ".join(p.name for p, _ in removed)
            log.info(
                "removed %d stale temp file(s) of checkpoint %s (%.1f MB): %s",
                len(removed),
                self.path,
                size / 1e6,
                names,
            )


class _Nested:
    """A run inside a larger one (an ensemble member): its saves go through ``wrap``,
    which puts its state beside what the larger run has finished."""

    def __init__(self, parent: Resumable, state: State | None, wrap: Callable[[State], State]):
        self._parent = parent
        self._state = state
        self._wrap = wrap

    @property
    def state(self) -> State | None:
        return self._state

    @property
    def active(self) -> bool:
        return self._parent.active

    def due(self, epoch: int) -> bool:
        return self._parent.due(epoch)

    def save(self, state: State) -> None:
        self._parent.save(self._wrap(state))

    def nested(self, state: State | None, wrap: Callable[[State], State]) -> Resumable:
        return _Nested(self, state, wrap)
