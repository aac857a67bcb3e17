"""Stage `evaluate@<trajectory>`: each predictor of the trajectory's posterior (BMA over
its samples), its metrics and plot data, one MLflow run each (`evaluate@<predictor>`).

The inputs (the posterior, test, validation, shifted and OOD images) load
once for all the trajectory's predictors. Runs on `BAYESAVG_NPROC` processes
like finetune (torchrun; default 1: this process): every rank loads the same
inputs and predicts with the posterior samples it owns, predictor after
predictor; rank 0 combines them in sample order (bitwise what one process
gives), measures sharpness, tracks and writes. Every rank, and the single
process, runs `BAYESAVG_THREADS` intra-op threads (``bayesavg.runtime.numerics``).

    python stages/evaluate.py <trajectory>               # all its predictors
    python stages/evaluate.py <trajectory> <predictor>   # one of them
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from _common import (
    MANIFEST,
    PREPARED,
    delegated,
    digest,
    main,
    params,
    predictor_files,
    scratch,
    tracked,
)
from _sets import one_set

from bayesavg.runtime.errors import UserError
from bayesavg.runtime.io import write_csv, write_json, write_npz

if TYPE_CHECKING:
    import torch

    from bayesavg.config import Params
    from bayesavg.data.datasets import Split
    from bayesavg.data.prepared import Prepared
    from bayesavg.data.shift import Shift
    from bayesavg.evaluation.evaluate import Evaluation
    from bayesavg.posteriors.file import PosteriorFile
    from bayesavg.training.distributed import World

SHIFT_KEYS = ("accuracy", "nll", "ece", "brier", "entropy")


class Inputs(NamedTuple):
    """What every rank predicts on: the same bytes on each, built from the params' seed."""

    data: Prepared
    posterior: PosteriorFile
    bn_x: torch.Tensor | None
    splits: dict[str, tuple[torch.Tensor, torch.Tensor]]
    subset: Split
    listed: list[Shift]
    ood: dict[str, torch.Tensor]
    official: list[str]  # the shifts taken from published arrays (CIFAR-10-C), not generated


def load_inputs(p: Params, trajectory: str, device: torch.device) -> Inputs:
    """The prepared data, the posterior, BN images, splits (test, val, shifted test) and
    OOD images for the predictors of ``trajectory``, model-ready on ``device``. The BN
    images are loaded when the model has BatchNorm and some predictor recomputes it."""
    from bayesavg.data.extra_sets import (
        official_cifar_c,
        ood_images,
        shift_subset,
        shifted,
        subset_positions,
    )
    from bayesavg.data.prepared import load_prepared
    from bayesavg.data.shift import shifts
    from bayesavg.evaluation.evaluate import bn_inputs, needs_bn_data
    from bayesavg.posteriors.file import load_posterior

    e = p.evaluate
    data = load_prepared(PREPARED)
    posterior = load_posterior(posterior_path(trajectory))
    bn_x = None
    methods = [pred.method for pred in e.predictors[trajectory].values()]
    if posterior.has_batchnorm and any(needs_bn_data(m) for m in methods):
        bn_x = bn_inputs(posterior, data.train, e.bn_update_fraction, p.seed, device)
    splits = {
        split: (posterior.inputs(part.x, device), part.y)
        for split, part in (("test", data.test), ("val", data.val))
    }
    subset = shift_subset(data.test, e.shift.n_points, p.seed)
    sh = e.shift
    listed = shifts(sh.angles, sh.corruptions, sh.severity, sh.cifar_c, sh.cifar_c_severities)
    official, served = None, []
    if any(s.cifar_c is not None for s in listed):  # only then load cifar_c (and scipy)
        at = subset_positions(len(data.test), sh.n_points, p.seed)
        official, served = official_cifar_c(p.data.raw_dir, p.data.dataset, p.seed, data.test, at)
    for shift_name, images in shifted(subset.x, listed, p.seed, official).items():
        splits[f"shift.{shift_name}"] = (posterior.inputs(images, device), subset.y)
    fractions = (p.seed, p.data.test_fraction, p.data.val_fraction)
    ood = {
        spec: posterior.inputs(
            ood_images(
                spec, posterior.input_shape, p.data.raw_dir, fractions, e.ood.n_points, p.seed
            ),
            device,
        )
        for spec in e.ood.sets
    }
    return Inputs(data, posterior, bn_x, splits, subset, listed, ood, served)


def posterior_path(trajectory: str) -> Path:
    return Path("models") / trajectory / "posterior.pt"


def predict(
    p: Params, name: str, found: Inputs, world: World, device: torch.device
) -> dict[str, Evaluation]:
    """This rank's share of the BMA (``evaluate``); the results on rank 0, {} on others."""
    from bayesavg.evaluation.evaluate import evaluate, needs_bn_data
    from bayesavg.seeding import derive_seed
    from bayesavg.training.precision import precision_for

    pred, e = p.evaluate.by_name[name], p.evaluate

    def run(
        splits: dict[str, tuple[torch.Tensor, torch.Tensor]],
        ood: dict[str, torch.Tensor],
        on: World | None,
        temperature: float | None,
    ) -> dict[str, Evaluation]:
        return evaluate(
            found.posterior,
            pred.method,
            splits,
            n_samples=pred.samples_or(e.n_samples),
            scale=pred.effective_scale(),
            bn_x=found.bn_x if needs_bn_data(pred.method) else None,
            batch_size=e.batch_size,
            ece_bins=e.ece_bins,
            seed=derive_seed(p.seed, "evaluate", name),
            device=device,
            name=name,
            ood=ood,
            world=on,
            precision=precision_for(p.precision, device),
            temperature=temperature,
            # An ensemble's calibrated NLL by members: what every predictor's deep-ensemble
            # equivalent is read against (the report's calibration section).
            calibrate=("val", "test") if pred.method == "ensemble" and "test" in splits else None,
            curves=("test",) if "test" in splits else (),  # the only curve written
        )

    if pred.temperature is not None and name not in TEMPERATURES:
        # Every rank fits T itself on the validation split (one network, one forward
        # pass), so all ranks temper with the same bytes without a broadcast.
        val = run({"val": found.splits["val"]}, {}, None, None)["val"]
        TEMPERATURES[name] = _fit(name, val.log_probs, found.splits["val"][1])
    return run(found.splits, found.ood, world, TEMPERATURES.get(name))


# Fitted temperatures by predictor: fitted once in ``predict``, logged by ``_predictor``.
TEMPERATURES: dict[str, float] = {}


def _fit(name: str, log_probs: torch.Tensor, y: torch.Tensor) -> float:
    from bayesavg.predictors.calibration import fit_temperature

    try:
        return fit_temperature(log_probs, y)
    except ValueError as err:
        raise UserError(f"predictor {name}: temperature scaling on val: {err}") from None


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.seeding import resolve_device
    from bayesavg.training.distributed import World, current_world, leave, local_device

    p = params()
    trajectory, names = _args(p)
    device = local_device(resolve_device(p.device, p.deterministic))

    def share() -> None:
        # Joined first: under torchrun the thread count is set before any work.
        world = current_world(device) or World(0, 1, device)
        try:
            # Rank 0 loads first, the others after it: an OOD set not on disk yet is
            # downloaded once, not by every rank into the same files at once.
            _barrier(world, not world.is_main)
            found = load_inputs(p, trajectory, device)
            _barrier(world, world.is_main)
            for name in names:
                if world.is_main:
                    _predictor(p, name, found, world, device)
                else:
                    predict(p, name, found, world, device)
        finally:
            leave(world)

    if delegated(share):
        return
    # All the predictors' files or none (a failure in the third leaves no first two): the
    # stage's output folders when it evaluates all, else the one predictor's files.
    files = [f for name in names for f in predictor_files(trajectory, name)]
    outs = [f.parent for f in files] if len(sys.argv) == 2 else files
    with one_set(outs, [f"evaluate@{name}" for name in names]):
        share()


def _args(p: Params) -> tuple[str, list[str]]:
    """The trajectory and the predictors of it to evaluate (all, or the one named)."""
    listed = p.evaluate.predictors
    if len(sys.argv) not in (2, 3) or sys.argv[1] not in listed:
        raise UserError(
            f"usage: evaluate.py <trajectory> [<predictor>], one of {', '.join(listed)}"
        )
    trajectory, names = sys.argv[1], list(listed[sys.argv[1]])
    if len(sys.argv) == 3:
        if sys.argv[2] not in names:
            raise UserError(
                f"evaluate.py {trajectory}: {sys.argv[2]!r} is not one of its predictors "
                f"({', '.join(names)})"
            )
        names = [sys.argv[2]]
    return trajectory, names


def _predictor(p: Params, name: str, found: Inputs, world: World, device: torch.device) -> None:
    """Rank 0's part for one predictor: its run, the BMA, sharpness, its files."""
    from bayesavg.evaluation.calibrated import calibrated_metrics
    from bayesavg.evaluation.evaluate import bn_subset, method_of, needs_bn_data
    from bayesavg.predict import MODEL_CODE, PredictorConfig
    from bayesavg.predictors.sampling import sigma_ratio
    from bayesavg.seeding import derive_seed

    pred, e = p.evaluate.by_name[name], p.evaluate
    logged = {
        "predictor": {"trajectory": pred.trajectory, **pred.model_dump()},
        "evaluate": e.model_dump(exclude={"predictors"}),
        "scale": pred.effective_scale(),
        "sampling_seed": derive_seed(p.seed, "evaluate", name),  # `bayesavg evaluate --seed`
    }
    posterior_file = posterior_path(pred.trajectory)
    files = predictor_files(pred.trajectory, name)
    with tracked(f"evaluate@{name}", p, logged, [MANIFEST, posterior_file]) as mlrun:
        results = predict(p, name, found, world, device)
        data, posterior = found.data, found.posterior
        bn_x = found.bn_x if needs_bn_data(pred.method) else None
        subset, listed = found.subset, found.listed
        # Sent first: the worker logs the served model while this process measures
        # sharpness and writes the files (for the last predictor, instead of after).
        bn_images = None
        if bn_x is not None:
            # The BatchNorm images the served model needs: the tracking worker copies them
            # into the model later, so they go where they outlive the run.
            bn_images = scratch() / "bn_images.pt"
            if not bn_images.exists():
                import torch

                torch.save(bn_subset(data.train, e.bn_update_fraction, p.seed).x, bn_images)
        mlrun.log_model(
            name=name,
            posterior=str(posterior_file),
            digest=digest(posterior_file),
            config=PredictorConfig(
                method=pred.method,
                scale=pred.effective_scale(),
                n_samples=pred.samples_or(e.n_samples),
                seed=derive_seed(p.seed, "evaluate", name),
                batch_size=e.batch_size,
                temperature=TEMPERATURES.get(name),
            ).as_mapping(),
            input_shape=list(posterior.input_shape),
            num_classes=posterior.num_classes,
            example=data.test.x[:2].tolist(),
            code=str(MODEL_CODE),
            bn_images=None if bn_images is None else str(bn_images),
        )
        sharp = _sharpness(p, pred.method, found, bn_x, device)
        result = results["test"]
        shift = {s.name: _pick(results[f"shift.{s.name}"].metrics) for s in listed}
        metrics = {
            **result.metrics,
            **sharp,
            "scale": pred.effective_scale(),
            "val": results["val"].metrics,
            "shift": shift,
            "ood": result.ood,
        }
        spread = sigma_ratio(posterior, method_of(pred.method))
        if spread is not None:
            metrics["sigma_ratio"] = spread
        if name in TEMPERATURES:
            metrics["temperature"] = TEMPERATURES[name]
        cifar_c = [s.name for s in listed if s.cifar_c is not None]
        if cifar_c:  # which CIFAR-10-C images these are: the benchmark's, or generated
            metrics["cifar_c_official"] = [n for n in cifar_c if n in found.official]
        metrics["calibrated"] = calibrated_metrics(
            results["val"].log_probs,
            found.splits["val"][1],
            result.log_probs,
            data.test.y,
            e.ece_bins,
        )
        write_json(files.metrics, metrics)
        write_csv(files.reliability, result.reliability.rows())
        write_csv(files.samples, result.by_samples)
        write_npz(
            files.predictions,
            {
                "y": data.test.y.numpy(),
                "log_probs": result.log_probs.numpy(),
                "shift_y": subset.y.numpy(),
                **{f"shift.{s.name}": results[f"shift.{s.name}"].log_probs.numpy() for s in listed},
                **{
                    f"ood.{key}.{score}": values.cpu().numpy()
                    for key, by_score in result.ood_scores.items()
                    for score, values in by_score.items()
                },
            },
        )
        mlrun.log_metrics(
            {
                **_prefixed("test/", result.metrics),
                **sharp,
                **_prefixed("val/", results["val"].metrics),
                **_prefixed("sigma_ratio/", spread or {}),
                **({"temperature": TEMPERATURES[name]} if name in TEMPERATURES else {}),
                **{
                    f"calibrated/{k}": v
                    for k, v in metrics["calibrated"].items()
                    if isinstance(v, float)
                },
                **{f"shift/{k}/{m}": v for k, row in shift.items() for m, v in row.items()},
                **{
                    f"ood/{spec}/{score}/{m}": v
                    for spec, by_score in result.ood.items()
                    for score, row in by_score.items()
                    for m, v in row.items()
                },
            }
        )
        mlrun.log_history(result.by_samples, step_key="samples", prefix="by_samples/")
        mlrun.log_artifact(files.reliability, "plots")
        mlrun.log_artifact(files.predictions, "predictions")


_SHARPNESS: dict[tuple[int, str, bool], dict[str, float]] = {}


def _sharpness(
    p: Params, method: str, found: Inputs, bn_x: torch.Tensor | None, device: torch.device
) -> dict[str, float]:
    """Sharpness at the predictor's centre(s). Predictors of one trajectory whose methods
    share a centre (swa, swag_diag and swag: the snapshot mean) and its BatchNorm
    treatment get the same numbers, computed once."""
    from bayesavg.evaluation.centre import centre_sharpness
    from bayesavg.evaluation.evaluate import method_of
    from bayesavg.seeding import derive_seed

    key = (id(found.posterior), method_of(method).centre, bn_x is not None)
    if key not in _SHARPNESS:
        sh = p.evaluate.sharpness
        part = found.data.train.random_subset(sh.n_points, derive_seed(p.seed, "sharpness"))
        _SHARPNESS[key] = centre_sharpness(
            found.posterior,
            method,
            found.posterior.model_input(part.x, device),
            part.y,
            bn_x=bn_x,
            rho=sh.rho,
            probes=sh.probes,
            seed=derive_seed(p.seed, "probes"),
            device=device,
            batch_size=sh.batch_size or p.evaluate.batch_size,
        )
    return _SHARPNESS[key]


def _barrier(world: World, now: bool) -> None:
    """A barrier that every rank of a multi-process run enters once, when ``now``."""
    if now and world.size > 1:
        import torch.distributed as dist

        dist.barrier()


def _pick(metrics: dict[str, float]) -> dict[str, float]:
    return {k: metrics[k] for k in SHIFT_KEYS}


def _prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}{k}": v for k, v in metrics.items()}


if __name__ == "__main__":
    main(run)
