"""Stages `finetune_seed@<seed>` and `evaluate_seed@<seed>`: the pipeline at one more seed.

`python stages/replicate.py finetune|evaluate <seed>`, one pair per seed of
`seeds`. For every seed but the pipeline's own (`seed`), `finetune` reruns
pretraining and every trajectory with that seed on the same data split
(`seeds/<seed>/models/<t>/posterior.pt`) and `evaluate` every predictor on the
test split (`seeds/<seed>/results/metrics.json` and the per-point
log-probabilities `predictions.npz`, `bayesavg.seeds.replicate`): a predictor's
change reruns the predictions at every seed, not the training. The pipeline's
own seed is its stages, whose files the report reads where they are: its two
stages only write a marker saying so, and read nothing. One MLflow run each,
tagged and parametrised with the seed.
"""

import sys
from pathlib import Path
from typing import Any

from _common import MANIFEST, PREPARED, main, mark_outputs, params, tracked

from bayesavg.config import Params
from bayesavg.runtime.errors import UserError
from bayesavg.runtime.io import write_json

METRICS = ("accuracy", "nll", "ece", "brier", "temperature", "n", "n_samples")
OWN = {"source": "pipeline"}


def run() -> None:
    p = params()
    args = sys.argv[1:]
    if (
        len(args) != 2
        or args[0] not in ("finetune", "evaluate")
        or not (args[1].isascii() and args[1].isdigit())
    ):
        raise UserError("usage: replicate.py finetune|evaluate <seed>")
    step, seed = args[0], int(args[1])
    if seed not in p.seeds:
        raise UserError(f"seed {seed} is not one of seeds: {p.seeds}")
    root = Path("seeds") / str(seed)
    out = root / ("models" if step == "finetune" else "results")
    stage = f"{step}_seed@{seed}"
    ps = p.model_copy(update={"seed": seed})
    with tracked(stage, ps, {"replicate": step}, [MANIFEST] if seed != p.seed else []) as mlrun:
        if seed == p.seed:
            write_json(out / "pipeline.json", {"seed": seed, **OWN})
        elif step == "finetune":
            _finetune(ps, out)
        else:
            _evaluate(ps, root / "models", out, mlrun)
        mark_outputs(mlrun, sorted(f for f in out.rglob("*") if f.is_file()))


def _finetune(p: Params, out: Path) -> None:
    from bayesavg.data.prepared import load_prepared
    from bayesavg.posteriors.file import save_posterior
    from bayesavg.seeding import resolve_device
    from bayesavg.seeds.replicate import posteriors

    found = posteriors(p, load_prepared(PREPARED), resolve_device(p.device, p.deterministic))
    for name in p.finetune:
        save_posterior(out / name / "posterior.pt", found[name])


def _evaluate(p: Params, models: Path, out: Path, mlrun: Any) -> None:
    from bayesavg.data.prepared import load_prepared
    from bayesavg.posteriors.file import load_posterior
    from bayesavg.runtime.io import write_npz
    from bayesavg.seeding import resolve_device
    from bayesavg.seeds.replicate import predictions

    prepared = load_prepared(PREPARED)
    used = {pred.trajectory for pred in p.evaluate.by_name.values()}
    found = {t: load_posterior(models / t / "posterior.pt") for t in sorted(used)}
    results = predictions(p, prepared, found, resolve_device(p.device, p.deterministic))
    arrays = {name: r.log_probs for name, r in results.items()}
    write_npz(out / "predictions.npz", {"y": prepared.test.y.numpy(), **arrays})
    summary = {n: {k: r.metrics[k] for k in METRICS if k in r.metrics} for n, r in results.items()}
    write_json(out / "metrics.json", {"seed": p.seed, "source": "replicate", "test": summary})
    mlrun.log_metrics({f"{n}.{k}": v for n, m in summary.items() for k, v in m.items()})


if __name__ == "__main__":
    main(run)
