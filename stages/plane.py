"""Stage `plane@<trajectory>`: the training loss on the PCA plane of its snapshots."""

import sys
from pathlib import Path

from _common import MANIFEST, PREPARED, main, params, tracked

from bayesavg.errors import UserError
from bayesavg.io import write_csv, write_json

OUT = Path("plots/plane")


def run() -> None:
    # Imported here, not above: torch loads while _common.main's tracking worker starts.
    from bayesavg.data import load_prepared
    from bayesavg.models import for_inference
    from bayesavg.plane import loss_plane
    from bayesavg.posterior_file import load_posterior
    from bayesavg.seeding import derive_seed, resolve_device

    p = params()
    pp = p.evaluate.plane
    if len(sys.argv) != 2 or sys.argv[1] not in pp.trajectories:
        listed = ", ".join(pp.trajectories) or "none: list them in evaluate.plane.trajectories"
        raise UserError(f"usage: plane.py <trajectory>, one of {listed}")
    name = sys.argv[1]
    traj = p.finetune[name]
    logged = {"trajectory": name, "plane": pp.model_dump(), "batch_size": p.evaluate.batch_size}
    posterior_file = Path("models") / name / "posterior.pt"
    with tracked(f"plane@{name}", p, logged, [MANIFEST, posterior_file]) as mlrun:
        device = resolve_device(p.device)
        data = load_prepared(PREPARED)
        posterior = load_posterior(posterior_file)
        state = posterior.hwa["mu"] if posterior.hwa else posterior.collector
        if state is None:
            raise UserError(f"plane: trajectory {name!r} has no snapshots in its posterior file")
        part = data.train.random_subset(pp.n_points, derive_seed(p.seed, "plane"))
        x = posterior.model_input(part.x, device)
        # BatchNorm statistics at each point come from the same fixed training subset.
        result = loss_plane(
            for_inference(posterior.build_model(device)),
            state,
            x,
            part.y,
            grid=pp.grid,
            margin=pp.margin,
            start=posterior.start_theta,
            bn_x=x if posterior.has_batchnorm else None,
            batch_size=p.evaluate.batch_size,
        )
        out = OUT / name
        summary = {
            "trajectory": name,
            "start": traj.start,
            "n_points": len(part),
            **result.summary(),
        }
        write_csv(out / "grid.csv", result.grid)
        write_csv(out / "path.csv", result.path)
        write_json(out / "summary.json", summary)
        ratio = summary["explained_variance_ratio"]
        mlrun.log_metrics(
            {
                "pc1_explained_variance_ratio": ratio[0],
                "pc2_explained_variance_ratio": ratio[1],
                "centre_loss": summary["centre_loss"],
                "centre_accuracy": summary["centre_accuracy"],
                "start_distance": summary["start_distance"],
                "snapshots": summary["n_snapshots"],
            }
        )
        for file in ("grid.csv", "path.csv", "summary.json"):
            mlrun.log_artifact(out / file, f"plane/{name}")


if __name__ == "__main__":
    main(run)
