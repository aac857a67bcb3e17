"""Stage `pretrain`: deterministic SGD; writes the weights and their sha256."""

from pathlib import Path

from _common import PREPARED, main, params, tracked

from bayesavg.data import load_prepared
from bayesavg.io import sha256_file, write_csv, write_json, write_text
from bayesavg.posterior_file import save_posterior
from bayesavg.seeding import resolve_device
from bayesavg.trajectories import pretrain_members

OUT = Path("models/pretrain/posterior.pt")


def run() -> None:
    p = params()
    logged = {"model": p.model.model_dump(), "pretrain": p.pretrain.model_dump()}
    with tracked("pretrain", p, logged, upstream=["data"]) as mlrun:
        result = pretrain_members(p, load_prepared(PREPARED), resolve_device(p.device))
        save_posterior(OUT, result.posterior)
        write_text(OUT.with_suffix(".sha256"), f"{sha256_file(OUT)}  {OUT.name}\n")
        write_csv("plots/pretrain.csv", result.history)
        last = result.history[-1]
        final = {k: v for k, v in last.items() if k not in ("epoch", "lr", "seconds")}
        final["seconds"] = sum(row["seconds"] for row in result.history)
        write_json("metrics/pretrain.json", final)
        mlrun.log_history(result.history)
        mlrun.log_artifact(OUT.with_suffix(".sha256"))


if __name__ == "__main__":
    main(run)
