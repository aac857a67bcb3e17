"""Stage `data`: load the dataset, split it, write tensors and a manifest."""

from _common import PREPARED, main, params, tracked

from bayesavg.data import prepare


def run() -> None:
    p = params()
    d = p.data
    with tracked("data", p, {"data": d.model_dump()}, upstream=[]) as mlrun:
        prepared = prepare(d.dataset, d.raw_dir, PREPARED, p.seed, d.test_fraction, d.val_fraction)
        mlrun.log_metrics({f"n_{k}": v["n"] for k, v in prepared.manifest["splits"].items()})
        mlrun.log_artifact(PREPARED / "manifest.json")


if __name__ == "__main__":
    main(run)
