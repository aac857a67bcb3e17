"""Stage `finetune@<trajectory>`: continue from the start's weights; write the posterior.

Resumable: a checkpoint under checkpoints/ (every `checkpoint.every` epochs)
lets a killed run continue where it stopped, logging into the same MLflow
run; it is deleted once the outputs are written. A distributed SWAG
trajectory (`kind: dswag`) runs on `BAYESAVG_NPROC` processes through
torchrun (default 1: this process); its rank 0 tracks and writes. A Laplace
approximation (`kind: laplace`) trains nothing: it fits the start's last layer. Every other
kind runs data-parallel on those processes (each rank a share of every batch;
ensemble members spread across ranks), resumable under the same count.
"""

import sys
from pathlib import Path

from _checkpoint import stage_checkpoint
from _common import (
    MANIFEST,
    PREPARED,
    delegated,
    digest,
    main,
    mark_outputs,
    params,
    tracked,
    write_history,
)

from bayesavg.runtime.errors import UserError


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.config import DSWAGTrajectory, LaplaceTrajectory
    from bayesavg.data.prepared import load_prepared
    from bayesavg.dswag.rounds import finetune_dswag
    from bayesavg.posteriors.file import load_posterior, save_posterior
    from bayesavg.seeding import device_model, resolve_device
    from bayesavg.training.distributed import current_world, leave, local_device
    from bayesavg.trajectories import compute_for, finetune

    p = params()
    if len(sys.argv) != 2 or sys.argv[1] not in p.finetune:
        raise UserError(f"usage: finetune.py <trajectory>, one of {', '.join(p.finetune)}")
    name = sys.argv[1]
    stage = f"finetune@{name}"
    out = Path("models") / name / "posterior.pt"
    history = Path("plots/finetune") / f"{name}.csv"
    traj = p.finetune[name].model_dump()
    start_file = Path("models") / p.finetune[name].start / "posterior.pt"
    device = local_device(resolve_device(p.device, p.deterministic))
    distributed = isinstance(p.finetune[name], DSWAGTrajectory)
    laplace = isinstance(p.finetune[name], LaplaceTrajectory)

    def work(prepared, start, ckpt=None):
        if distributed:
            return finetune_dswag(p, name, prepared, start, device)
        world = current_world(device)
        try:
            return finetune(p, name, prepared, start, device, ckpt, compute_for(p, device, world))
        finally:
            if world is not None:
                leave(world)

    if delegated(lambda: work(load_prepared(PREPARED), load_posterior(start_file))):
        return
    inputs = [MANIFEST, start_file]
    ckpt = (
        None
        if distributed or laplace
        else stage_checkpoint(stage, p, {"finetune": traj}, inputs, device_model(device))
    )
    logged = {"trajectory": name, "finetune": traj}
    resume = ckpt.meta.get("run_id") if ckpt else None
    with tracked(stage, p, logged, inputs, resume=resume) as mlrun:
        if ckpt:
            ckpt.meta["run_id"] = mlrun.run_id
        start = load_posterior(start_file)
        prepared = load_prepared(PREPARED)
        result = work(prepared, start, ckpt)
        assert result is not None
        save_posterior(out, result.posterior)
        write_history(history, result.history)
        mark_outputs(mlrun, [out])
        mlrun.log_history(result.history)
        post = result.posterior
        state = post.collector or (post.hwa["mu"] if post.hwa else None)
        mlrun.log_metrics({"snapshots": state["n_collected"] if state else 0})
        mlrun.log_artifact_once(out, "posterior", digest(out))
    if ckpt:
        ckpt.remove()


if __name__ == "__main__":
    main(run)
