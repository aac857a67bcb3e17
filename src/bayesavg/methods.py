"""The predictor methods, in one place for params validation, evaluation and the CLI.

A module of its own so that validating params.yaml does not import torch.
"""

from __future__ import annotations

METHODS = (
    "map",
    "swa",
    "swag_diag",
    "swag",
    "vi",
    "hwa",
    "hwa_mf",
    "hwa_rho",
    "mc_dropout",
    "ensemble",
    "sgld",
)
