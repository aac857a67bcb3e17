"""Stage `init`: the fresh network that trajectories with `start: init` train from.

Every distributed SWAG run (the `dswag` trajectory and each worker count of
the sweep) starts from these same weights, as in the paper.
"""

from pathlib import Path

from _common import MANIFEST, PREPARED, main, mark_outputs, params, tracked

from bayesavg.io import sha256_file, write_text

OUT = Path("models/init/posterior.pt")


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.data import load_prepared
    from bayesavg.posterior_file import save_posterior
    from bayesavg.trajectories import initial_network

    p = params()
    with tracked("init", p, {"model": p.model.model_dump()}, [MANIFEST]) as mlrun:
        save_posterior(OUT, initial_network(p, load_prepared(PREPARED)))
        write_text(OUT.with_suffix(".sha256"), f"{sha256_file(OUT)}  {OUT.name}\n")
        mark_outputs(mlrun, [OUT])


if __name__ == "__main__":
    main(run)
