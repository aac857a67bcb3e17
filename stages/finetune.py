"""Stage `finetune@<trajectory>`: continue from the pretrained weights; write the posterior."""

import sys
from pathlib import Path

from _common import PREPARED, main, params, tracked

from bayesavg.data import load_prepared
from bayesavg.errors import UserError
from bayesavg.io import write_csv
from bayesavg.posterior_file import load_posterior, save_posterior
from bayesavg.seeding import resolve_device
from bayesavg.trajectories import finetune


def run() -> None:
    p = params()
    if len(sys.argv) != 2 or sys.argv[1] not in p.finetune:
        raise UserError(f"usage: finetune.py <trajectory>, one of {', '.join(p.finetune)}")
    name = sys.argv[1]
    stage = f"finetune@{name}"
    out = Path("models") / name / "posterior.pt"
    logged = {"trajectory": name, "finetune": p.finetune[name].model_dump()}
    origin = p.finetune[name].start
    upstream = ["data", "pretrain" if origin == "pretrain" else f"finetune@{origin}"]
    with tracked(stage, p, logged, upstream=upstream) as mlrun:
        start = load_posterior(Path("models") / origin / "posterior.pt")
        result = finetune(p, name, load_prepared(PREPARED), start, resolve_device(p.device))
        save_posterior(out, result.posterior)
        write_csv(Path("plots/finetune") / f"{name}.csv", result.history)
        mlrun.log_history(result.history)
        post = result.posterior
        state = post.collector or (post.hwa["mu"] if post.hwa else None)
        mlrun.log_metrics({"snapshots": state["n_collected"] if state else 0})
        mlrun.log_artifact(out, "posterior")


if __name__ == "__main__":
    main(run)
