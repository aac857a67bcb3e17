"""A short run of the real training and evaluation code; prints the bytes' digests as JSON.

Run as a script (``python tests/numerics_probe.py PREPARED_DIR``), natively and under
an emulated CPU (``qemu-x86_64 -cpu Haswell``), by ``tests/test_numerics.py``: the
pins in ``bayesavg.runtime.numerics`` make the digests the same. What it runs is the
pipeline's own code on an mnist5k subset: LeNet-5 pretrained from its seed for 16
SGD steps; from there 16 steps of the SWAG trajectory with a snapshot every 4, 16
steps of mean-field VI (Adam) and the last-layer KFAC Laplace fit with its prior
precision by marginal likelihood; one SWAG sample and the Laplace's probit predictive
evaluated on 200 test images.
"""

from __future__ import annotations

import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "src"))

from bayesavg.runtime import numerics

numerics.pin()

import hashlib
import json
from pathlib import Path

import torch

from bayesavg.config import Params
from bayesavg.data.datasets import Split
from bayesavg.data.prepared import Prepared, load_prepared, to_input
from bayesavg.evaluation.evaluate import evaluate
from bayesavg.trajectories import finetune, pretrain

TRAIN, TEST, BATCH = 512, 200, 32

PARAMS = {
    "seed": 0,
    "device": "cpu",
    "data": {"dataset": "mnist5k"},
    "model": {"name": "lenet5"},
    "pretrain": {
        "epochs": 1,
        "batch_size": BATCH,
        "members": 1,
        "schedule": {"kind": "cosine", "lr": 0.05, "lr_end": 0.0005},
    },
    "finetune": {
        "swag": {
            "start": "pretrain",
            "epochs": 1,
            "batch_size": BATCH,
            "schedule": {"kind": "constant", "lr": 0.02},
            "collect": {"start_epoch": 0, "every": 4, "max_rank": 4},
        },
        "vi": {
            "kind": "vi",
            "start": "pretrain",
            "epochs": 1,
            "batch_size": BATCH,
            "momentum": 0.0,
            "weight_decay": 0.0,
            "schedule": {"kind": "cosine", "lr": 0.001, "lr_end": 0.00001},
            "vi": {"sigma_init": 0.03, "optimizer": "adam"},
        },
        "laplace": {"kind": "laplace", "start": "pretrain", "batch_size": 256},
    },
    "evaluate": {"predictors": {"swag": {"swag": {"method": "swag"}}}},
}


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def subset(split: Split, n: int) -> Split:
    return Split(split.x[:n], split.y[:n])


def main(prepared_dir: str) -> None:
    full = load_prepared(Path(prepared_dir))
    prepared = Prepared(subset(full.train, TRAIN), subset(full.val, 64), full.test, full.manifest)
    params = Params.model_validate(PARAMS)
    cpu = torch.device("cpu")
    pre = pretrain(params, prepared, cpu)
    swag = finetune(params, "swag", prepared, pre.posterior, cpu)
    vi = finetune(params, "vi", prepared, pre.posterior, cpu)
    laplace = finetune(params, "laplace", prepared, pre.posterior, cpu).posterior
    fit = laplace.laplace
    assert fit is not None
    test = subset(full.test, TEST)
    x = to_input(test.x, full.manifest["mean"], full.manifest["std"])
    result = evaluate(swag.posterior, "swag", {"test": (x, test.y)}, n_samples=1, seed=0)["test"]
    probit = evaluate(laplace, "laplace", {"test": (x, test.y)}, n_samples=1, seed=0)["test"]
    collected = [v for v in (swag.posterior.collector or {}).values() if torch.is_tensor(v)]
    out = {
        "pretrain": digest([pre.posterior.theta]),
        "swag": digest([swag.posterior.theta, *collected]),
        "vi": digest([vi.posterior.theta, vi.posterior.rho]),
        "laplace": digest(
            [t for b in fit["blocks"] for t in b["eigenvectors"] + b["eigenvalues"]]
            + [fit["prior_precision"]]
        ),
        "nll": result.metrics["nll"],
        "log_probs": digest([result.log_probs]),
        "laplace_log_probs": digest([probit.log_probs]),
        "settings": numerics.describe(),
    }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
