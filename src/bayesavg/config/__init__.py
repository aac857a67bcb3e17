"""Typed params.yaml with validation before any work starts.

pydantic checks types, ranges and unknown keys (strict: ``"0.1"`` is not a
float, ``1`` is not a bool); cross-field rules are model validators. Any
problem becomes a ``UserError`` naming the key and what is allowed.

One module per params section; this package exports them all. ``methods`` is the predictor
registry the predictors are validated against (and evaluation, the CLI and the report read)."""

from __future__ import annotations

from .base import (
    DATASETS,
    DEFAULT_DROPOUT,
    MODEL_NAMES,
    Fraction,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
)
from .data_model import AugmentParams, DataParams, DropoutRate, ModelParams
from .evaluation import (
    DSWAGSweep,
    EvaluateParams,
    Grid,
    LandscapeParams,
    LineSpec,
    OODParams,
    PlaneParams,
    Predictor,
    RaysParams,
    SharpnessParams,
    ShiftParams,
    SwagDirectionsParams,
)
from .params import Params, load_params, parse_params
from .run import BootstrapParams, CheckpointParams, MonitorParams, ReportParams, TrackingParams
from .trajectories import (
    STARTS,
    AnyTrajectory,
    ClientSplit,
    Collect,
    DSWAGTrajectory,
    LaplaceTrajectory,
    Optim,
    Phase1,
    Phase2,
    PretrainParams,
    Schedule,
    Share,
    Trajectory,
    VIParams,
)

__all__ = [
    "DATASETS",
    "DEFAULT_DROPOUT",
    "MODEL_NAMES",
    "STARTS",
    "AnyTrajectory",
    "AugmentParams",
    "BootstrapParams",
    "CheckpointParams",
    "ClientSplit",
    "Collect",
    "DSWAGSweep",
    "DSWAGTrajectory",
    "DataParams",
    "DropoutRate",
    "EvaluateParams",
    "Fraction",
    "Grid",
    "LandscapeParams",
    "LaplaceTrajectory",
    "LineSpec",
    "ModelParams",
    "MonitorParams",
    "NonNegFloat",
    "NonNegInt",
    "OODParams",
    "Optim",
    "Params",
    "Phase1",
    "Phase2",
    "PlaneParams",
    "PosFloat",
    "PosInt",
    "Predictor",
    "PretrainParams",
    "RaysParams",
    "ReportParams",
    "Schedule",
    "Share",
    "SharpnessParams",
    "ShiftParams",
    "SwagDirectionsParams",
    "TrackingParams",
    "Trajectory",
    "VIParams",
    "load_params",
    "parse_params",
]
