"""Stage `dswag_sweep`: the dswag trajectory re-run on W clients (DSWAG paper, Figs 5-7),
for every W in `evaluate.dswag_sweep.workers`, each W its own MLflow run
(`dswag_sweep@<W>`), metrics and plot files.

Phase 1 stops at `evaluate.dswag_sweep.target_accuracy` or after its
`rounds`; everything else is the trajectory's. Writes the per-round history,
the accuracy at theta_bar + m sigma z, the test metrics of the FedAvg
model, DSWA and DSWAG, and the posterior (models/<trajectory>_sweep/w<W>).
Runs on `BAYESAVG_NPROC` processes like finetune: every rank goes through
the W in order.

    python stages/dswag_sweep.py          # every W
    python stages/dswag_sweep.py <W>      # one of them
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from _common import (
    MANIFEST,
    PREPARED,
    delegated,
    main,
    mark_outputs,
    params,
    tracked,
    write_history,
)
from _sets import one_set

from bayesavg.runtime.errors import UserError
from bayesavg.runtime.io import write_csv, write_json

if TYPE_CHECKING:
    import torch

    from bayesavg.config import DSWAGTrajectory, Params
    from bayesavg.data.prepared import Prepared
    from bayesavg.posteriors.file import PosteriorFile

PREDICTORS = {"fedavg": "map", "dswa": "swa", "dswag": "swag"}
METRICS = Path("metrics/dswag_sweep")
PLOTS = Path("plots/dswag_sweep")


def sweep_model(trajectory: str, w: int) -> Path:
    """Where the sweep keeps the posterior of W clients (one DVC output folder for all W)."""
    return Path("models") / f"{trajectory}_sweep" / f"w{w}" / "posterior.pt"


def point_outputs(trajectory: str, w: int) -> list[Path]:
    """What the sweep writes for ``w`` clients: its posterior's folder, history, accuracy
    along sigma and metrics, each in one of the stage's output folders (in that order)."""
    return [
        sweep_model(trajectory, w).parent,
        PLOTS / "rounds" / f"{w}.csv",
        PLOTS / "sigma_distance" / f"{w}.csv",
        METRICS / f"{w}.json",
    ]


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.data.prepared import load_prepared
    from bayesavg.dswag.rounds import finetune_dswag
    from bayesavg.posteriors.file import load_posterior
    from bayesavg.runtime.launch import is_rank
    from bayesavg.seeding import resolve_device
    from bayesavg.training.distributed import joined, local_device

    p = params()
    sweep = p.evaluate.dswag_sweep
    workers = [str(w) for w in sweep.workers]
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] not in workers):
        listed = ", ".join(workers) or "none: list them in evaluate.dswag_sweep.workers"
        raise UserError(f"usage: dswag_sweep.py [<workers>], one of {listed}")
    chosen = [int(sys.argv[1])] if len(sys.argv) == 2 else list(sweep.workers)
    base = p.finetune[sweep.trajectory]
    start_file = Path("models") / base.start / "posterior.pt"
    device = local_device(resolve_device(p.device, p.deterministic))
    start = load_posterior(start_file)

    def variant(w: int) -> tuple[str, DSWAGTrajectory]:
        phase1 = base.phase1.model_copy(
            update={"rounds": sweep.rounds, "target_accuracy": sweep.target_accuracy}
        )
        return f"{sweep.trajectory}_w{w}", base.model_copy(update={"clients": w, "phase1": phase1})

    def share() -> None:
        data = load_prepared(PREPARED)
        for w in chosen:
            name, traj = variant(w)
            finetune_dswag(p, name, data, start, device, traj)

    # Under torchrun, one process group for every W (distributed.joined says why).
    with joined(device) if is_rank() else contextlib.nullcontext():
        if delegated(share):
            return
        # Every W's files or none (a failure at the second W leaves no first): the stage's
        # output folders when it runs every W, else the one W's files.
        folders = [f.parent for f in point_outputs(sweep.trajectory, 0)]  # any W's: the outs
        outs = folders if len(sys.argv) == 1 else point_outputs(sweep.trajectory, chosen[0])
        with one_set(outs, [f"dswag_sweep@{w}" for w in chosen]):
            data = load_prepared(PREPARED)
            for w in chosen:
                _point(p, w, *variant(w), data, start, start_file, device)
            # With no W listed (workers: []) the outputs DVC expects are empty folders.
            for out in folders:
                out.mkdir(parents=True, exist_ok=True)


def _point(
    p: Params,
    w: int,
    name: str,
    traj: DSWAGTrajectory,
    data: Prepared,
    start: PosteriorFile,
    start_file: Path,
    device: torch.device,
) -> None:
    """Train the sweep's trajectory on ``w`` clients, evaluate it, write its files."""
    from bayesavg.analyses.sweep import rounds_to_target, sigma_distance
    from bayesavg.dswag.rounds import finetune_dswag
    from bayesavg.evaluation.evaluate import bn_inputs, evaluate
    from bayesavg.posteriors.file import save_posterior
    from bayesavg.seeding import derive_seed

    sweep = p.evaluate.dswag_sweep
    stage = f"dswag_sweep@{w}"
    logged = {
        "workers": w,
        "finetune": traj.model_dump(),
        "sweep": sweep.model_dump(exclude={"workers"}),
        "n_samples": p.evaluate.n_samples,
    }
    with tracked(stage, p, logged, [MANIFEST, start_file]) as mlrun:
        result = finetune_dswag(p, name, data, start, device, traj)
        assert result is not None
        posterior = result.posterior
        bn_x = None
        if posterior.has_batchnorm:
            bn_x = bn_inputs(posterior, data.train, p.evaluate.bn_update_fraction, p.seed, device)
        test = (posterior.inputs(data.test.x, device), data.test.y.to(device))
        snapshots = posterior.collector["n_collected"]
        metrics: dict[str, object] = {
            "workers": w,
            "rounds": len(result.history),
            "rounds_to_target": rounds_to_target(result.history, sweep.target_accuracy),
            "target_accuracy": sweep.target_accuracy,
            "snapshots": snapshots,
        }
        for key, method in PREDICTORS.items():
            if method == "swag" and snapshots < 2:
                metrics[key] = None  # one snapshot: no covariance to sample (ALGORITHMS §8)
                continue
            found = evaluate(
                posterior,
                method,
                {"test": test},
                n_samples=p.evaluate.n_samples,
                bn_x=bn_x,
                batch_size=p.evaluate.batch_size,
                ece_bins=p.evaluate.ece_bins,
                seed=derive_seed(p.seed, "dswag_sweep", w, key),
                device=device,
                name=f"{key} (W={w})",
                curves=(),
            )["test"].metrics
            metrics[key] = {k: found[k] for k in ("accuracy", "nll", "ece", "brier")}
        distance = sigma_distance(
            posterior,
            *test,
            sweep.sigma_multiples,
            sweep.sigma_draws,
            derive_seed(p.seed, "dswag_sweep", "sigma"),
            bn_x=bn_x,
            batch_size=p.evaluate.batch_size,
        )
        _, rounds, along_sigma, summary = point_outputs(sweep.trajectory, w)
        write_history(rounds, result.history)
        write_csv(along_sigma, distance)
        write_json(summary, metrics)
        model = sweep_model(sweep.trajectory, w)
        save_posterior(model, posterior)
        mark_outputs(mlrun, [model])
        mlrun.log_history(result.history)
        flat = {
            f"{key}_{k}": v
            for key in PREDICTORS
            if isinstance(metrics[key], dict)
            for k, v in metrics[key].items()
        }
        flat["rounds"] = float(len(result.history))
        if metrics["rounds_to_target"] is not None:
            flat["rounds_to_target"] = float(metrics["rounds_to_target"])
        mlrun.log_metrics(flat)
        mlrun.log_artifact(rounds, "plots")
        mlrun.log_artifact(along_sigma, "plots")


if __name__ == "__main__":
    main(run)
