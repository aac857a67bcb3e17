"""Stage `evaluate@<predictor>`: BMA over posterior samples; metrics and plot data."""

import sys
import tempfile
from pathlib import Path

from _common import MANIFEST, PREPARED, digest, main, params, tracked

from bayesavg.errors import UserError
from bayesavg.io import write_csv, write_json, write_npz

SHIFT_KEYS = ("accuracy", "nll", "ece", "brier", "entropy")


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.data import load_prepared
    from bayesavg.evaluate import bn_subset, centre_sharpness, evaluate, method_of, needs_bn_data
    from bayesavg.extra_sets import ood_images, shift_subset, shifted
    from bayesavg.posterior_file import load_posterior
    from bayesavg.predict import MODEL_CODE, PredictorConfig
    from bayesavg.sampling import sigma_ratio
    from bayesavg.seeding import derive_seed, resolve_device
    from bayesavg.shift import shifts

    p = params()
    if len(sys.argv) != 2 or sys.argv[1] not in p.evaluate.predictors:
        raise UserError(
            f"usage: evaluate.py <predictor>, one of {', '.join(p.evaluate.predictors)}"
        )
    name = sys.argv[1]
    pred = p.evaluate.predictors[name]
    e = p.evaluate
    logged = {
        "predictor": pred.model_dump(),
        "evaluate": e.model_dump(exclude={"predictors"}),
        "scale": pred.effective_scale(),
    }
    stage = f"evaluate@{name}"
    posterior_file = Path("models") / pred.trajectory / "posterior.pt"
    # The BatchNorm images the served model needs outlive the run: the tracking worker
    # copies them into the model after the stage's last line.
    with (
        tempfile.TemporaryDirectory() as tmp,
        tracked(stage, p, logged, [MANIFEST, posterior_file]) as mlrun,
    ):
        device = resolve_device(p.device)
        data = load_prepared(PREPARED)
        posterior = load_posterior(posterior_file)
        bn_x = None
        if posterior.has_batchnorm and needs_bn_data(pred.method):
            bn_part = bn_subset(data.train, e.bn_update_fraction, p.seed)
            bn_x = posterior.model_input(bn_part.x, device)
        splits = {
            split: (posterior.model_input(part.x, device), part.y)
            for split, part in (("test", data.test), ("val", data.val))
        }
        subset = shift_subset(data.test, e.shift.n_points, p.seed)
        listed = shifts(e.shift.angles, e.shift.corruptions, e.shift.severity)
        for shift_name, images in shifted(subset.x, listed, p.seed).items():
            splits[f"shift.{shift_name}"] = (posterior.model_input(images, device), subset.y)
        fractions = (p.seed, p.data.test_fraction, p.data.val_fraction)
        ood = {
            spec: posterior.model_input(
                ood_images(
                    spec, posterior.input_shape, p.data.raw_dir, fractions, e.ood.n_points, p.seed
                ),
                device,
            )
            for spec in e.ood.sets
        }
        results = evaluate(
            posterior,
            pred.method,
            splits,
            n_samples=e.n_samples,
            scale=pred.effective_scale(),
            bn_x=bn_x,
            batch_size=e.batch_size,
            ece_bins=e.ece_bins,
            seed=derive_seed(p.seed, "evaluate", name),
            device=device,
            name=name,
            ood=ood,
        )
        sh = e.sharpness
        part = data.train.random_subset(sh.n_points, derive_seed(p.seed, "sharpness"))
        sharp = centre_sharpness(
            posterior,
            pred.method,
            posterior.model_input(part.x, device),
            part.y,
            bn_x=bn_x,
            rho=sh.rho,
            probes=sh.probes,
            seed=derive_seed(p.seed, "probes"),
            device=device,
            batch_size=e.batch_size,
        )
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
        write_json(Path("metrics") / f"{name}.json", metrics)
        write_csv(Path("plots/reliability") / f"{name}.csv", result.reliability.rows())
        write_csv(Path("plots/samples") / f"{name}.csv", result.by_samples)
        predictions = Path("predictions") / f"{name}.npz"
        write_npz(
            predictions,
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
        mlrun.log_artifact(Path("plots/reliability") / f"{name}.csv", "plots")
        mlrun.log_artifact(predictions, "predictions")
        bn_images = None
        if bn_x is not None:
            import torch

            bn_images = str(Path(tmp) / "bn_images.pt")
            torch.save(bn_subset(data.train, e.bn_update_fraction, p.seed).x, bn_images)
        mlrun.log_model(
            name=name,
            posterior=str(posterior_file),
            digest=digest(posterior_file),
            config=PredictorConfig(
                method=pred.method,
                scale=pred.effective_scale(),
                n_samples=e.n_samples,
                seed=derive_seed(p.seed, "evaluate", name),
                batch_size=e.batch_size,
            ).as_mapping(),
            input_shape=list(posterior.input_shape),
            num_classes=posterior.num_classes,
            example=data.test.x[:2].tolist(),
            code=str(MODEL_CODE),
            bn_images=bn_images,
        )


def _pick(metrics: dict[str, float]) -> dict[str, float]:
    return {k: metrics[k] for k in SHIFT_KEYS}


def _prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}{k}": v for k, v in metrics.items()}


if __name__ == "__main__":
    main(run)
