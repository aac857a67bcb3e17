"""Tiny posteriors to evaluate and the body of a spawned rank, for tests/test_evaluate_ranks.py.

A module of its own (not the test file) so that ``torch.multiprocessing``'s spawned
children import only this and bayesavg. Every case is rebuilt from its name in each
process (seeded weights, SWAG snapshots and inputs), so the parent and its children
evaluate the same bytes without sending tensors across.
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bayesavg.evaluation.evaluate import Evaluation, evaluate
from bayesavg.models import build_model
from bayesavg.posteriors import SWAG
from bayesavg.posteriors.file import PosteriorFile
from bayesavg.training.distributed import join, leave

CLASSES = 3
FEATURES = 12
RANK_TIMEOUT = timedelta(seconds=60)  # a rank stuck in a collective fails rather than hangs

# name: (network's keyword arguments, method, samples). Each hard in its own way: SWAG
# samples need every earlier draw of one generator and a BN update each; MC dropout
# draws its masks from torch's global stream; SWAG on a network with dropout and BN
# draws masks during the BN update (train mode) only.
CASES: dict[str, tuple[dict[str, Any], str, int]] = {
    "swag_bn": ({"hidden": [16], "batch_norm": True}, "swag", 5),
    "mc_dropout": ({"hidden": [16, 8], "dropout": 0.3, "batch_norm": True}, "mc_dropout", 5),
    "swag_bn_dropout": ({"hidden": [16, 8], "dropout": 0.3, "batch_norm": True}, "swag", 3),
}


def posterior(case: str) -> PosteriorFile:
    """Seeded weights (and BN statistics); for SWAG, 6 snapshots around them (rank 5)."""
    kwargs, method, _ = CASES[case]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        net = build_model("mlp", (1, 1, FEATURES), CLASSES, kwargs)
        for name, buffer in net.named_buffers():
            if name.endswith("running_mean"):
                buffer.normal_(0.0, 0.1)
            elif name.endswith("running_var"):
                buffer.uniform_(0.5, 1.5)
    found = PosteriorFile.from_model(
        net,
        trajectory=case,
        model_name="mlp",
        model_kwargs=kwargs,
        input_shape=(1, 1, FEATURES),
        mean=[0.0],
        std=[1.0],
        num_classes=CLASSES,
        data={"dataset": "synthetic", "seed": 0},
    )
    if method == "swag":
        swag = SWAG(found.theta.numel(), max_rank=5)
        gen = torch.Generator().manual_seed(1)
        for _ in range(6):
            swag.collect(found.theta + 0.1 * torch.randn(found.theta.shape, generator=gen))
        found.collector = swag.state_dict()
    return found


def inputs() -> dict[str, Any]:
    """Two labelled splits, one OOD set and training inputs for the BN updates."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(CLASSES, FEATURES, generator=g)

    def split(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, CLASSES, (n,), generator=g)
        return (centres[y] + torch.randn(n, FEATURES, generator=g)).view(n, 1, 1, FEATURES), y

    splits = {"test": split(70), "val": split(30)}
    return {
        "splits": splits,
        "ood": {"noise": 3 * torch.randn(25, 1, 1, FEATURES, generator=g)},
        "bn_x": split(90)[0],
    }


def run_case(case: str, **extra: Any) -> dict[str, Evaluation]:
    """``evaluate`` on the case: batches of 40 rows, so every pass spans several batches."""
    _, method, samples = CASES[case]
    data = inputs()
    return evaluate(
        posterior(case),
        method,
        data["splits"],
        n_samples=samples,
        bn_x=data["bn_x"],
        batch_size=40,
        seed=11,
        ood=data["ood"],
        **extra,
    )


def plain(results: dict[str, Evaluation]) -> dict[str, Any]:
    """What a test compares, as plain values and CPU tensors (to save and reload)."""
    return {
        split: {
            "metrics": r.metrics,
            "by_samples": r.by_samples,
            "log_probs": r.log_probs,
            "reliability": r.reliability.rows(),
            "ood": r.ood,
            "ood_scores": {k: {s: v.cpu() for s, v in d.items()} for k, d in r.ood_scores.items()},
        }
        for split, r in results.items()
    }


def rank_main(rank: int, world: int, folder: str) -> None:
    """One spawned rank: every case in one gloo group (a file store); rank 0 saves the
    results as ``results-<world>.pt``, every rank writes ``ok-<world>-<rank>`` saying
    what ``evaluate`` returned to it."""
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    out = Path(folder)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{out / f'store-{world}'}",
            rank=rank,
            world_size=world,
            timeout=RANK_TIMEOUT,
        )
        me = join(torch.device("cpu"))
        found = {case: plain(run_case(case, world=me)) for case in CASES}
        leave(me)
        if rank == 0:
            torch.save(found, out / f"results-{world}.pt")
        returned = ",".join(sorted({split for result in found.values() for split in result}))
        (out / f"ok-{world}-{rank}").write_text(returned)
    except BaseException:
        (out / f"error-{world}-{rank}.txt").write_text(traceback.format_exc())
        raise
