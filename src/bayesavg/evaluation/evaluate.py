"""Predict with a posterior: sample weights, update BN, average probabilities.

The hot path keeps everything on the device: weights are written straight
into one model by copying (no state-dict copies, channels-last kept), test
inputs are uint8 images normalised a batch at a time (``data.inputs``), and the
BMA is accumulated in log space.
Metrics for s = 1..S samples come from the running average at no extra
forward passes.

Samples can be spread over the processes of a torch.distributed run: rank r
computes the samples it owns (s - 1 = r mod N), rank 0 takes their
log-probabilities in sample order (``distributed.in_client_order``) and
accumulates exactly as one process does, so the results are bitwise the
same for any N (with the same intra-op thread count on every rank).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from ..config.methods import METHODS, REGISTRY, Method
from ..data.datasets import Split
from ..data.inputs import Chained, Input, Inputs
from ..models import dropout_modules, for_inference, has_batchnorm
from ..posteriors.file import PosteriorFile, load_theta
from ..predictors.calibration import apply_temperature
from ..predictors.sampling import Draws, Network, draws
from ..runtime.errors import UserError
from ..seeding import derive_seed, isolated_rng
from ..training.batchnorm import update_bn
from ..training.distributed import World, in_client_order
from ..training.precision import Precision
from .calibrated import calibrated_nll
from .metrics import Reliability, classification_metrics, protocol_metrics, reliability
from .ood import OODAccumulator, ood_metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """One split's results. ``ood``: for the split OOD sets were scored against, per OOD set
    and score, AUROC, AUPR-In, AUPR-Out and FPR at 95% TPR (OOD the positive class);
    ``ood_scores``: the per-point scores behind them, for that split and each OOD set."""

    metrics: dict[str, float]
    reliability: Reliability
    by_samples: list[dict[str, float]]
    log_probs: torch.Tensor
    ood: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    ood_scores: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


def method_of(name: str) -> Method:
    """The registry entry of a predictor method; unknown names are a ``UserError``."""
    if name not in REGISTRY:
        raise UserError(f"unknown predictor method {name!r}; choose one of {', '.join(METHODS)}")
    return REGISTRY[name]


def needs_bn_data(method: str) -> bool:
    """Whether ``method`` recomputes BatchNorm statistics (so needs training inputs)."""
    return not method_of(method).own_buffers


def bn_rows(n: int, fraction: float, seed: int) -> torch.Tensor:
    """Positions, in their order, of the fixed random share of an ``n``-image training
    split used for BatchNorm updates.

    The pipeline and ``bayesavg evaluate`` both draw it from the data seed,
    so the same fraction gives the same images.
    """
    keep = max(1, round(fraction * n))
    draw = torch.Generator().manual_seed(derive_seed(seed, "bn_subset"))
    return torch.randperm(n, generator=draw)[:keep]


def bn_subset(train: Split, fraction: float, seed: int) -> Split:
    """The images and labels of ``bn_rows``, copied."""
    return train.subset(bn_rows(len(train), fraction, seed))


def bn_inputs(
    posterior: PosteriorFile, train: Split, fraction: float, seed: int, device: torch.device | str
) -> Inputs:
    """The BatchNorm images of ``bn_rows`` as ``posterior``'s input, read a batch at a time
    (a memory-mapped training split is never copied whole)."""
    return posterior.inputs(train.x, device, rows=bn_rows(len(train), fraction, seed))


@torch.inference_mode()
def log_softmax_predictions(
    model: nn.Module,
    x: Input,
    batch_size: int,
    dropout: bool = False,
    precision: Precision | None = None,
) -> torch.Tensor:
    """Float64 log-probabilities in eval mode; ``dropout`` keeps dropout layers sampling masks.

    The forward pass runs under ``precision`` (fp32 when None: no autocast); the
    logits are cast to float32, then float64, before the log-softmax, so the
    probabilities the metrics see are never rounded to bf16/fp16 (the casts
    are exact, and no-ops on fp32 logits: fp32 gives the bytes it always gave).
    """
    model.eval()
    for m in dropout_modules(model) if dropout else []:
        m.train()
    out = []
    for i in range(0, x.shape[0], batch_size):
        with precision.autocast() if precision is not None else contextlib.nullcontext():
            logits = model(x[i : i + batch_size])
        out.append(torch.log_softmax(logits.float().double(), dim=1))
    return torch.cat(out)


def _in_order(sampled: Draws) -> Callable[[int], Network]:
    """Network s (1-based) of ``sampled``, drawing every earlier network first.

    A sampler's generator is one sequential stream (SWAG, VI and HWA draw
    their noise from it), so network s exists only after networks 1..s-1
    were drawn. Each rank draws them all, in order, and predicts with its
    own, so the weights are the bytes one process draws. Drawing is cheap
    beside predicting: a rank-20 SWAG draw took 2.6% of a LeNet-5 forward
    pass over 1,000 images and 0.35% of a PreResNet-20's (CPU, one thread),
    and a stage predicts several thousand rows per network.
    """
    drawn = 0

    def network(s: int) -> Network:
        nonlocal drawn
        if s <= drawn:
            raise ValueError(f"network {s} asked for after network {drawn}: draw in order")
        while drawn < s - 1:
            sampled.draw(drawn)
            drawn += 1
        drawn = s
        return sampled.draw(s - 1)

    return network


def evaluate(
    posterior: PosteriorFile,
    method: str,
    splits: Mapping[str, tuple[Input, torch.Tensor]],
    *,
    n_samples: int = 30,
    scale: float | None = None,
    bn_x: Input | None = None,
    batch_size: int = 1000,
    ece_bins: int = 20,
    seed: int = 0,
    device: torch.device | str = "cpu",
    name: str | None = None,
    ood: Mapping[str, Input] | None = None,
    ood_reference: str = "test",
    point_scores: bool = False,
    world: World | None = None,
    precision: Precision | None = None,
    temperature: float | None = None,
    calibrate: tuple[str, str] | None = None,
    curves: Collection[str] | None = None,
) -> dict[str, Evaluation]:
    """Bayesian model average over ``n_samples`` weight samples of ``method``.

    ``splits`` maps a name ("test", "val") to model-ready inputs and labels;
    all splits share each sample and its BN update, in one forward pass.
    ``bn_x`` (training inputs) is required when the model has BatchNorm and
    the method samples weights. ``name`` (the predictor's, default the
    method's) names it in errors: non-finite predictive probabilities stop
    here instead of becoming NaN metrics.

    ``ood`` maps a name to model-ready inputs from elsewhere (no labels): each
    sampled network predicts them in the same forward pass as the splits, and
    their max-probability, entropy and mutual-information scores are compared
    with those of split ``ood_reference`` (its ``Evaluation.ood``). ``point_scores``: keep
    the per-point scores of split ``ood_reference`` (``Evaluation.ood_scores``) even
    without OOD sets, for a predictor that reports entropy and mutual information.

    ``world``: this process's place in a torch.distributed run (None: one
    process). Every rank must call with the same arguments; sample s is
    computed by rank (s - 1) mod N and rank 0 combines the samples in order,
    so the results are bitwise those of one process. Ranks other than 0
    return an empty dict. ``precision``: forward passes (and BN updates)
    under its autocast; None is fp32, bitwise as before. ``temperature``: each sampled
    network's log-probabilities divided by T and renormalised (``calibration``); for a
    single-network method that is temperature scaling of the predictive.
    ``calibrate`` (fit, target): after each sample s, the average of the first s is
    tempered by its own T fitted on split ``fit`` and its NLL on split ``target`` is the
    column ``nll_calibrated`` of the target's ``by_samples`` (NaN where the fit is
    degenerate): an ensemble's calibrated NLL by members, which the deep-ensemble
    equivalent reads (Ashukha et al. 2020).

    ``curves``: the splits whose ``by_samples`` has a row for each s = 1..S (the report's
    curves over S; None: all). The others get the row s = S alone, the final metrics,
    skipping per-sample metrics nobody reads (a stage reads 1 of its 22 splits'). The
    calibrate target needs its curve.

    Randomness torch draws from its global stream (dropout masks: MC dropout,
    or a BN update of a network with dropout) comes from a stream of its own
    per sample, seeded by (``seed``, s), so that any rank can compute sample s
    alone. Predictors that draw nothing from that stream keep the bytes that
    one stream through all samples gave: all but MC dropout, and a BN update
    of a network whose dropout feeds a BatchNorm layer.
    """
    device = torch.device(device)
    world = world or World(0, 1, device)
    entry = method_of(method)
    name = name or method
    model = for_inference(posterior.build_model(device))
    generator = torch.Generator(device=device).manual_seed(seed)
    sampled = draws(
        posterior,
        entry,
        entry.default_scale if scale is None else scale,
        generator,
        device,
        n_samples,
    )
    total = sampled.count or n_samples
    needs_bn = not entry.own_buffers and has_batchnorm(model)
    if needs_bn and bn_x is None:
        raise UserError(f"predictor {name} on a BatchNorm model needs training data for BN")
    names = list(splits)
    curved = set(names if curves is None else curves)
    if not curved <= set(names):
        raise ValueError(f"curves {sorted(curved - set(names))} are not among the splits")
    if calibrate is not None and calibrate[1] not in curved:
        raise ValueError(f"calibrate's target {calibrate[1]!r} needs its curve (curves)")
    ood = dict(ood or {})
    if (ood or point_scores) and ood_reference not in splits:
        raise ValueError(f"ood_reference {ood_reference!r} is not one of the splits")
    sizes = [splits[n][0].shape[0] for n in names]
    ood_sizes = [x.shape[0] for x in ood.values()]
    x_all = Chained([splits[n][0] for n in names] + list(ood.values()), device)
    scored = ood or point_scores
    scorers = {key: OODAccumulator() for key in [ood_reference, *ood]} if scored else {}
    ys = [splits[n][1].to(device) for n in names]
    log_sum: torch.Tensor | None = None
    # per split, (s, metrics of the average of the first s networks)
    per_s: dict[str, list[tuple[int, dict[str, torch.Tensor]]]] = {n: [] for n in names}
    network = _in_order(sampled)

    def predict(s: int) -> torch.Tensor:
        """Sample s's log-probabilities over every input, on the rank that owns it."""
        theta, buffers = network(s)
        with torch.no_grad():
            load_theta(model, theta, buffers or {})
        # Dropout masks come from torch's global stream: a private copy, seeded per sample.
        with isolated_rng(derive_seed(seed, "sample", s), device):
            if needs_bn:
                with precision.autocast() if precision else contextlib.nullcontext():
                    update_bn(model, bn_x, batch_size)
            if sampled.predict is not None:
                logp = sampled.predict(model, x_all, batch_size)
            else:
                logp = log_softmax_predictions(
                    model, x_all, batch_size, dropout=sampled.dropout, precision=precision
                )
        return logp if temperature is None else apply_temperature(logp, temperature)

    progress = tqdm(
        total=total, desc=f"evaluate {name}", disable=None if world.is_main else True, leave=False
    )

    def take(s: int, logp: torch.Tensor) -> None:
        """Rank 0: add sample s to the BMA, in sample order (``logp`` may be a reused buffer)."""
        nonlocal log_sum
        if scorers:
            parts = dict(zip([*names, *ood], logp.split(sizes + ood_sizes), strict=True))
            for key, scorer in scorers.items():
                scorer.add(parts[key])
            logp = logp[: sum(sizes)]
        log_sum = logp.clone() if log_sum is None else torch.logaddexp(log_sum, logp)
        bmas = dict(zip(names, (log_sum - math.log(s)).split(sizes), strict=True))
        for split, y in zip(names, ys, strict=True):
            if split in curved:
                per_s[split].append((s, classification_metrics(bmas[split], y, ece_bins)))
        if calibrate is not None:
            fit, target = calibrate
            labels = dict(zip(names, ys, strict=True))
            per_s[target][-1][1]["nll_calibrated"] = calibrated_nll(
                bmas[fit], labels[fit], bmas[target], labels[target]
            )
        progress.update()

    shape = (x_all.shape[0], posterior.num_classes)
    with progress:
        in_client_order(world, range(1, total + 1), predict, take, shape)
    if not world.is_main:
        return {}
    assert log_sum is not None
    if not bool(torch.isfinite(log_sum).all()):
        raise UserError(
            f"predictor {name}: the predictive probabilities are not finite (a sampled network "
            "gives NaN or infinite outputs); check the posterior file and the scale"
        )
    bmas = (log_sum - math.log(total)).split(sizes)
    for split, bma, y in zip(names, bmas, ys, strict=True):
        if split not in curved:  # the bytes its row s = S would have held
            per_s[split].append((total, classification_metrics(bma, y, ece_bins)))
    results = {
        split: _summarise(per_s[split], bma, y, total, ece_bins)
        for split, bma, y in zip(names, bmas, ys, strict=True)
    }
    if scorers:
        scores = {key: scorer.scores() for key, scorer in scorers.items()}
        reference = scores[ood_reference]
        found = {
            key: {
                score: {m: float(v) for m, v in metrics.items()}
                for score, metrics in ood_metrics(reference, scores[key]).items()
            }
            for key in ood
        }
        results[ood_reference] = dataclasses.replace(
            results[ood_reference], ood=found, ood_scores=scores
        )
    return results


def _summarise(
    per_s: list[tuple[int, dict[str, torch.Tensor]]],
    bma: torch.Tensor,
    y: torch.Tensor,
    total: int,
    ece_bins: int,
) -> Evaluation:
    """Final metrics and the table by sample count, with one device-to-host copy."""
    keys = list(per_s[0][1])
    table = torch.stack([torch.stack([row[k] for k in keys]) for _, row in per_s]).tolist()
    by_samples = [
        {"samples": s, **dict(zip(keys, vals, strict=True))}
        for (s, _), vals in zip(per_s, table, strict=True)
    ]
    metrics: dict[str, float] = dict(zip(keys, table[-1], strict=True))
    extra = protocol_metrics(bma, y, ece_bins)
    metrics.update(zip(extra, torch.stack(list(extra.values())).tolist(), strict=True))
    metrics["n"] = int(y.shape[0])
    metrics["n_samples"] = total
    return Evaluation(metrics, reliability(bma, y, ece_bins), by_samples, bma.cpu())
