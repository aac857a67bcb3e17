"""Stage `evaluate@<predictor>`: BMA over posterior samples; metrics and plot data."""

import sys
from pathlib import Path

import torch
from _common import PREPARED, main, params, tracked

from bayesavg.data import load_prepared
from bayesavg.errors import UserError
from bayesavg.evaluate import center_model, evaluate, model_input
from bayesavg.io import write_csv, write_json
from bayesavg.posterior_file import load_posterior
from bayesavg.seeding import derive_seed, resolve_device
from bayesavg.sharpness import hessian_trace, sam_sharpness


def run() -> None:
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
    with tracked(stage, p, logged, upstream=["data", f"finetune@{pred.trajectory}"]) as mlrun:
        device = resolve_device(p.device)
        data = load_prepared(PREPARED)
        posterior = load_posterior(Path("models") / pred.trajectory / "posterior.pt")
        bn_x = None
        if posterior.has_batchnorm and pred.method != "map":
            train_x = data.train.x
            if e.bn_update_fraction < 1:
                gen = torch.Generator().manual_seed(derive_seed(p.seed, "bn_subset"))
                keep = max(1, round(e.bn_update_fraction * len(train_x)))
                train_x = train_x[torch.randperm(len(train_x), generator=gen)[:keep]]
            bn_x = model_input(posterior, train_x, device)
        results = evaluate(
            posterior,
            pred.method,
            {
                split: (model_input(posterior, part.x, device), part.y)
                for split, part in (("test", data.test), ("val", data.val))
            },
            n_samples=e.n_samples,
            scale=pred.effective_scale(),
            bn_x=bn_x,
            batch_size=e.batch_size,
            ece_bins=e.ece_bins,
            seed=derive_seed(p.seed, "evaluate", name),
            device=device,
        )
        sh = e.sharpness
        gen = torch.Generator().manual_seed(derive_seed(p.seed, "sharpness"))
        subset = torch.randperm(len(data.train), generator=gen)[: sh.n_points]
        x_sub = model_input(posterior, data.train.x[subset], device)
        y_sub = data.train.y[subset].to(device)
        centre = center_model(posterior, pred.method, bn_x, device, e.batch_size)
        sharp = {
            "sharpness": sam_sharpness(centre, x_sub, y_sub, sh.rho, e.batch_size),
            "hessian_trace": hessian_trace(
                centre,
                x_sub,
                y_sub,
                sh.probes,
                gen.manual_seed(derive_seed(p.seed, "probes")),
                e.batch_size,
            ),
        }
        result = results["test"]
        metrics = {
            **result.metrics,
            **sharp,
            "scale": pred.effective_scale(),
            "val": results["val"].metrics,
        }
        write_json(Path("metrics") / f"{name}.json", metrics)
        write_csv(Path("plots/reliability") / f"{name}.csv", result.reliability.rows())
        write_csv(Path("plots/samples") / f"{name}.csv", result.by_samples)
        mlrun.log_metrics({**result.metrics, **sharp, **_prefixed("val_", results["val"].metrics)})
        mlrun.log_history(result.by_samples, step_key="samples", prefix="by_samples/")
        mlrun.log_artifact(Path("plots/reliability") / f"{name}.csv", "plots")


def _prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}{k}": v for k, v in metrics.items()}


if __name__ == "__main__":
    main(run)
