"""A stage's checkpoint, keyed by everything that changes its bytes: params, inputs, code.

Only the training stages (pretrain, finetune) resume; the rest of what stages share is
in ``_common``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from _common import CHECKPOINTS, STAGES, digest

from bayesavg.config import Params
from bayesavg.runtime import launch, numerics
from bayesavg.runtime.checkpoint import Checkpoint


def _code_digests() -> dict[str, str]:
    """sha256 of every project module this process has imported: the stage's code."""
    out = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if name == "bayesavg" or name.startswith("bayesavg."):
            out[name] = digest(path)
        elif path.parent == STAGES:
            out[f"stages/{path.name}"] = digest(path)
    return dict(sorted(out.items()))


def stage_checkpoint(
    stage: str, p: Params, stage_params: Mapping[str, Any], inputs: Sequence[Path], device: str
) -> Checkpoint:
    """The stage's checkpoint file, keyed by its params, its input files and its code.

    Call it after the stage has imported what it runs, so the code is all in
    ``sys.modules``. A checkpoint with another key is deleted when loaded.
    """
    key = {
        "stage": stage,
        "params": {"seed": p.seed, "device": p.device, **stage_params},
        # what changes the bytes besides the stage's own section; a checkpoint of N
        # processes holds N ranks' random streams, so it resumes under N only
        "compute": {
            "precision": p.precision,
            "channels_last": p.channels_last,
            # compiled and eager steps round differently: a resume keeps the run's kind
            "compile": p.compile,
            "cuda_graphs": p.cuda_graphs,
            # CUDA's fastest kernels: keyed only where chosen, so a default run's key stays
            **({} if p.deterministic else {"deterministic": False}),
            "augment": p.data.augment.model_dump(),
            "processes": launch.nproc(),
            "numerics": numerics.describe(),
            # the device the run really uses (``device: auto`` is the CPU on one machine, a
            # GPU on another): RNG streams and kernels differ, so no resume across them
            "device": device,
        },
        "inputs": {str(path): digest(path) for path in inputs},
        "code": _code_digests(),
    }
    text = json.dumps(key, sort_keys=True, default=str)
    ckpt = Checkpoint(
        CHECKPOINTS / f"{stage}.pt",
        hashlib.sha256(text.encode()).hexdigest(),
        p.checkpoint.every,
    )
    ckpt.load()
    return ckpt
