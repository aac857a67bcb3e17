"""Stage `data`: load the dataset, split it, write tensors and a manifest."""

from _common import MANIFEST, PREPARED, main, mark_outputs, params, prepared_datasets, tracked


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.data.prepared import prepare

    p = params()
    d = p.data
    with tracked("data", p, {"data": d.model_dump()}) as mlrun:
        prepared = prepare(d.dataset, d.raw_dir, PREPARED, p.seed, d.test_fraction, d.val_fraction)
        mark_outputs(mlrun, [MANIFEST])
        mlrun.log_datasets(prepared_datasets(MANIFEST))
        mlrun.log_metrics({f"n_{k}": v["n"] for k, v in prepared.manifest["splits"].items()})
        mlrun.log_artifact(MANIFEST)


if __name__ == "__main__":
    main(run)
