"""Stage `pretrain`: deterministic SGD; writes the weights and their sha256.

Resumable like fine-tuning (checkpoints/pretrain.pt), members included. With
`BAYESAVG_NPROC` > 1 it runs on that many processes (torchrun), each training
its share of the members; rank 0 tracks and writes.
"""

from pathlib import Path

from _common import (
    CLOCK_COLUMNS,
    MANIFEST,
    PREPARED,
    delegated,
    main,
    mark_outputs,
    params,
    stage_checkpoint,
    tracked,
    write_history,
)

from bayesavg.io import sha256_file, write_json, write_text

OUT = Path("models/pretrain/posterior.pt")


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.data import load_prepared
    from bayesavg.distributed import current_world, leave, local_device
    from bayesavg.posterior_file import save_posterior
    from bayesavg.seeding import resolve_device
    from bayesavg.trajectories import compute_for, pretrain_members

    p = params()
    device = local_device(resolve_device(p.device))

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
    ckpt = stage_checkpoint("pretrain", p, logged, [MANIFEST])
    with tracked("pretrain", p, logged, [MANIFEST], resume=ckpt.meta.get("run_id")) as mlrun:
        ckpt.meta["run_id"] = mlrun.run_id
        result = work(ckpt)
        assert result is not None
        save_posterior(OUT, result.posterior)
        write_text(OUT.with_suffix(".sha256"), f"{sha256_file(OUT)}  {OUT.name}\n")
        write_history(Path("plots/pretrain.csv"), result.history)
        last = result.history[-1]
        final = {k: v for k, v in last.items() if k not in ("epoch", "lr", *CLOCK_COLUMNS)}
        write_json("metrics/pretrain.json", final)
        mark_outputs(mlrun, [OUT])
        mlrun.log_history(result.history)
        mlrun.log_artifact(OUT.with_suffix(".sha256"))
    ckpt.remove()


if __name__ == "__main__":
    main(run)
