"""Stage `pretrain`: the networks trajectories start from, each with its sha256.

- `models/pretrain`: deterministic SGD (run `pretrain`). Resumable like
  fine-tuning (checkpoints/pretrain.pt), members included. With
  `BAYESAVG_NPROC` > 1 it runs on that many processes (torchrun), each
  training its share of the members; rank 0 tracks and writes.
- `models/init`: the fresh, seeded network of `start: init` trajectories (run
  `init`): every distributed SWAG run (the `dswag` trajectory and each W of
  the sweep) starts from it, as in the paper. Rewritten with the same bytes
  when only pretraining's params change, so nothing downstream of it reruns.
"""

from pathlib import Path

from _checkpoint import stage_checkpoint
from _common import (
    CLOCK_COLUMNS,
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

from bayesavg.config import Params
from bayesavg.runtime.io import sha256_file, write_json, write_text

OUT = Path("models/pretrain/posterior.pt")
INIT = Path("models/init/posterior.pt")
HISTORY = Path("plots/pretrain.csv")
METRICS = Path("metrics/pretrain.json")
OUTS = [OUT.parent, INIT.parent, HISTORY, METRICS]  # the stage's outputs (dvc.yaml)


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.data.prepared import load_prepared
    from bayesavg.posteriors.file import save_posterior
    from bayesavg.seeding import device_model, resolve_device
    from bayesavg.training.distributed import current_world, leave, local_device
    from bayesavg.trajectories import compute_for, pretrain_members

    p = params()
    device = local_device(resolve_device(p.device, p.deterministic))

    def work(ckpt=None):
        world = current_world(device)
        try:
            compute = compute_for(p, device, world)
            return pretrain_members(p, load_prepared(PREPARED), device, ckpt, compute)
        finally:
            if world is not None:
                leave(world)

    if delegated(work):
        return
    logged = {"model": p.model.model_dump(), "pretrain": p.pretrain.model_dump()}
    ckpt = stage_checkpoint("pretrain", p, logged, [MANIFEST], device_model(device))
    # Both runs' files or none; the checkpoint goes once both are written.
    with one_set(OUTS, ["pretrain", "init"]):
        with tracked("pretrain", p, logged, [MANIFEST], resume=ckpt.meta.get("run_id")) as mlrun:
            ckpt.meta["run_id"] = mlrun.run_id
            result = work(ckpt)
            assert result is not None
            save_posterior(OUT, result.posterior)
            write_text(OUT.with_suffix(".sha256"), f"{sha256_file(OUT)}  {OUT.name}\n")
            write_history(HISTORY, result.history)
            last = result.history[-1]
            final = {k: v for k, v in last.items() if k not in ("epoch", "lr", *CLOCK_COLUMNS)}
            write_json(METRICS, final)
            mark_outputs(mlrun, [OUT])
            mlrun.log_history(result.history)
            mlrun.log_artifact(OUT.with_suffix(".sha256"))
        _init(p)
    ckpt.remove()


def _init(p: Params) -> None:
    from bayesavg.data.prepared import load_prepared
    from bayesavg.posteriors.file import save_posterior
    from bayesavg.trajectories import initial_network

    with tracked("init", p, {"model": p.model.model_dump()}, [MANIFEST]) as mlrun:
        save_posterior(INIT, initial_network(p, load_prepared(PREPARED)))
        write_text(INIT.with_suffix(".sha256"), f"{sha256_file(INIT)}  {INIT.name}\n")
        mark_outputs(mlrun, [INIT])


if __name__ == "__main__":
    main(run)
