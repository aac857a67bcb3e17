"""Sections `checkpoint`, `tracking` and `report`: how a run resumes, logs and reports."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .base import NonNegInt, _Section


class CheckpointParams(_Section):
    """How often pretraining and fine-tuning stages save a checkpoint to resume from.

    Not a DVC param of any stage: it never changes a result, so changing it
    reruns nothing.
    """

    every: NonNegInt = 1  # epochs between checkpoints; 0 turns them off


class TrackingParams(_Section):
    experiment: Annotated[str, Field(min_length=1)] = "bayesavg"


class BootstrapParams(_Section):
    """Paired bootstrap over test points for every comparison in the report."""

    resamples: Annotated[int, Field(ge=100)] = 2000
    seed: NonNegInt = 0


class ReportParams(_Section):
    title: Annotated[str, Field(min_length=1)] = "bayesavg report"
    notes: str = ""
    bootstrap: BootstrapParams = BootstrapParams()
