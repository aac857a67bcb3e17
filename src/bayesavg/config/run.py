"""Sections `checkpoint`, `monitor`, `tracking` and `report`: how a run resumes, is
watched, logs and reports."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .base import NonNegInt, PosInt, Seed, _Section


class CheckpointParams(_Section):
    """How often pretraining and fine-tuning stages save a checkpoint to resume from.

    Not a DVC param of any stage: it never changes a result, so changing it
    reruns nothing.
    """

    every: NonNegInt = 1  # epochs between checkpoints; 0 turns them off


class MonitorParams(_Section):
    """The validation and test curves of training runs (``training.monitoring``).

    They change the curves (plots, MLflow metrics), never a posterior or a
    predictor; the CIFAR presets thin them to under 5% of an epoch.
    """

    every: PosInt = 1  # epochs between curve points; the last epoch always has one
    fraction: Annotated[float, Field(gt=0, le=1)] = 1.0  # share of the images, fixed by seed


class TrackingParams(_Section):
    experiment: Annotated[str, Field(min_length=1)] = "bayesavg"


class BootstrapParams(_Section):
    """Paired bootstrap over test points for every comparison in the report (ALGORITHMS
    §10 asks for at least 1,000 resamples: fewer leave the 2.5% tails to a couple dozen)."""

    resamples: Annotated[int, Field(ge=1000)] = 2000
    seed: Seed = 0


class ReportParams(_Section):
    title: Annotated[str, Field(min_length=1)] = "bayesavg report"
    notes: str = ""
    bootstrap: BootstrapParams = BootstrapParams()
