"""Stage `pretrain`: deterministic SGD; writes the weights and their sha256.

Resumable like fine-tuning (checkpoints/pretrain.pt), members included.
"""

from pathlib import Path

from _common import MANIFEST, PREPARED, main, mark_outputs, params, stage_checkpoint, tracked

from bayesavg.io import sha256_file, write_csv, write_json, write_text

OUT = Path("models/pretrain/posterior.pt")


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.data import load_prepared
    from bayesavg.posterior_file import save_posterior
    from bayesavg.seeding import resolve_device
    from bayesavg.trajectories import pretrain_members

    p = params()
    logged = {"model": p.model.model_dump(), "pretrain": p.pretrain.model_dump()}
    ckpt = stage_checkpoint("pretrain", p, logged, [MANIFEST])
    with tracked("pretrain", p, logged, [MANIFEST], resume=ckpt.meta.get("run_id")) as mlrun:
        ckpt.meta["run_id"] = mlrun.run_id
        result = pretrain_members(p, load_prepared(PREPARED), resolve_device(p.device), ckpt)
        save_posterior(OUT, result.posterior)
        write_text(OUT.with_suffix(".sha256"), f"{sha256_file(OUT)}  {OUT.name}\n")
        write_csv("plots/pretrain.csv", result.history)
        last = result.history[-1]
        final = {k: v for k, v in last.items() if k not in ("epoch", "lr", "seconds")}
        final["seconds"] = sum(row["seconds"] for row in result.history)
        write_json("metrics/pretrain.json", final)
        mark_outputs(mlrun, [OUT])
        mlrun.log_history(result.history)
        mlrun.log_artifact(OUT.with_suffix(".sha256"))
    ckpt.remove()


if __name__ == "__main__":
    main(run)
