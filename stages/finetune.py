"""Stage `finetune@<trajectory>`: continue from the start's weights; write the posterior.

Resumable: a checkpoint under checkpoints/ (every `checkpoint.every` epochs)
lets a killed run continue where it stopped, logging into the same MLflow
run; it is deleted once the outputs are written.
"""

import sys
from pathlib import Path

from _common import MANIFEST, PREPARED, main, mark_outputs, params, stage_checkpoint, tracked

from bayesavg.errors import UserError
from bayesavg.io import write_csv


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.data import load_prepared
    from bayesavg.posterior_file import load_posterior, save_posterior
    from bayesavg.seeding import resolve_device
    from bayesavg.trajectories import finetune

    p = params()
    if len(sys.argv) != 2 or sys.argv[1] not in p.finetune:
        raise UserError(f"usage: finetune.py <trajectory>, one of {', '.join(p.finetune)}")
    name = sys.argv[1]
    stage = f"finetune@{name}"
    out = Path("models") / name / "posterior.pt"
    history = Path("plots/finetune") / f"{name}.csv"
    traj = p.finetune[name].model_dump()
    start_file = Path("models") / p.finetune[name].start / "posterior.pt"
    inputs = [MANIFEST, start_file]
    ckpt = stage_checkpoint(stage, p, {"finetune": traj}, inputs)
    logged = {"trajectory": name, "finetune": traj}
    with tracked(stage, p, logged, inputs, resume=ckpt.meta.get("run_id")) as mlrun:
        ckpt.meta["run_id"] = mlrun.run_id
        start = load_posterior(start_file)
        result = finetune(p, name, load_prepared(PREPARED), start, resolve_device(p.device), ckpt)
        save_posterior(out, result.posterior)
        write_csv(history, result.history)
        mark_outputs(mlrun, [out])
        mlrun.log_history(result.history)
        post = result.posterior
        state = post.collector or (post.hwa["mu"] if post.hwa else None)
        mlrun.log_metrics({"snapshots": state["n_collected"] if state else 0})
        mlrun.log_artifact(out, "posterior")
    ckpt.remove()


if __name__ == "__main__":
    main(run)
