"""One more seed of the whole pipeline: every trajectory and predictor again, seeded anew.

The pipeline's own seed (``params.seed``) runs as its stages; each further
seed of ``params.seeds`` reruns pretraining, every trajectory (in start order)
and every predictor with ``seed`` replaced, on the same data split, so the
test points are the same images and per-seed differences are paired. Only
the test metrics and the per-point test log-probabilities are kept: what the
report needs for mean ± std over seeds and for each seed's paired test.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from ..config import DSWAGTrajectory, Params
from ..data.prepared import Prepared
from ..evaluation.evaluate import Evaluation, bn_inputs, evaluate, needs_bn_data
from ..posteriors.file import PosteriorFile
from ..predictors.calibration import fit_temperature
from ..seeding import derive_seed
from ..training.precision import precision_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SeedResult:
    """One predictor at one seed: its test metrics (and fitted temperature) and its
    per-point test log-probabilities (float32, test order)."""

    metrics: dict[str, float]
    log_probs: np.ndarray


def order(params: Params) -> list[str]:
    """The trajectories with every start before the trajectories that continue it."""
    done: list[str] = []
    pending = list(params.finetune)
    while pending:
        ready = [n for n in pending if params.finetune[n].start not in pending]
        done += ready
        pending = [n for n in pending if n not in ready]
    return done


def posteriors(
    params: Params, prepared: Prepared, device: torch.device
) -> dict[str, PosteriorFile]:
    """Pretraining, the fresh network and every trajectory at ``params.seed``."""
    from ..dswag.rounds import finetune_dswag
    from ..trajectories import finetune, initial_network, pretrain_members

    pre = pretrain_members(params, prepared, device)
    assert pre is not None
    found = {"pretrain": pre.posterior, "init": initial_network(params, prepared)}
    for name in order(params):
        start = found[params.finetune[name].start]
        if isinstance(params.finetune[name], DSWAGTrajectory):
            result = finetune_dswag(params, name, prepared, start, device)
        else:
            result = finetune(params, name, prepared, start, device)
        assert result is not None
        found[name] = result.posterior
        log.info("seed %d: %s done", params.seed, name)
    return found


def predictions(
    params: Params, prepared: Prepared, found: dict[str, PosteriorFile], device: torch.device
) -> dict[str, SeedResult]:
    """Every predictor of ``params.evaluate`` on the test split (val for temperatures)."""
    return {
        name: predict(params, name, prepared, found[pred.trajectory], device)
        for name, pred in params.evaluate.by_name.items()
    }


def predict(
    params: Params,
    name: str,
    prepared: Prepared,
    posterior: PosteriorFile,
    device: torch.device,
) -> SeedResult:
    """Predictor ``name`` on the test split, seeded as its evaluate stage seeds it; a
    ``temperature: fit`` predictor fits T on the validation split first."""
    e = params.evaluate
    pred = e.by_name[name]
    bn_x = None
    if posterior.has_batchnorm and needs_bn_data(pred.method):
        bn_x = bn_inputs(posterior, prepared.train, e.bn_update_fraction, params.seed, device)

    def run(split: str, temperature: float | None) -> Evaluation:
        part = prepared.test if split == "test" else prepared.val
        return evaluate(
            posterior,
            pred.method,
            {split: (posterior.inputs(part.x, device), part.y)},
            n_samples=pred.samples_or(e.n_samples),
            scale=pred.effective_scale(),
            bn_x=bn_x,
            batch_size=e.batch_size,
            ece_bins=e.ece_bins,
            seed=derive_seed(params.seed, "evaluate", name),
            device=device,
            name=name,
            precision=precision_for(params.precision, device),
            temperature=temperature,
            curves=(),
        )[split]

    temperature = None
    if pred.temperature is not None:
        temperature = fit_temperature(run("val", None).log_probs, prepared.val.y)
    test = run("test", temperature)
    metrics = {k: float(v) for k, v in test.metrics.items()}
    if temperature is not None:
        metrics["temperature"] = temperature
    return SeedResult(metrics, test.log_probs.float().numpy())
