"""Stage `data`: load the dataset, split it, write tensors and a manifest."""

from _common import MANIFEST, PREPARED, main, mark_outputs, params, prepared_datasets, tracked


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.data.prepared import prepare
    from bayesavg.data.pretrained_inputs import transforms_of
    from bayesavg.data.resize import resize_size_for
    from bayesavg.seeding import resolve_device

    p = params()
    d = p.data
    weights = transforms_of(p.model.weights)
    fit = normalise = None
    if weights is not None:
        normalise = (weights.mean, weights.std)
    if d.image_size is not None:
        ratio = None if weights is None else weights.resize_size / weights.crop_size
        fit = (d.resize_size or resize_size_for(d.image_size, ratio), d.image_size)
    logged = {"data": d.model_dump(), "model": {"weights": p.model.weights}}
    with tracked("data", p, logged) as mlrun:
        prepared = prepare(
            d.dataset,
            d.raw_dir,
            PREPARED,
            p.seed,
            d.test_fraction,
            d.val_fraction,
            fit,
            normalise,
            d.storage,
            resolve_device(p.device, p.deterministic),
        )
        mark_outputs(mlrun, [MANIFEST])
        mlrun.log_datasets(prepared_datasets(MANIFEST))
        mlrun.log_metrics({f"n_{k}": v["n"] for k, v in prepared.manifest["splits"].items()})
        mlrun.log_artifact(MANIFEST)


if __name__ == "__main__":
    main(run)
