"""Stage `landscape`: the loss landscape around posterior centres (SWA paper §4, DSWAG
Figs. 4 and 6; ALGORITHMS §6) and the loss planes of snapshots (HWA paper).

Every probe is a unit with its own MLflow run, metrics and plot files, named as
``plane@<trajectory>``, ``line@<name>``, ``rays@<trajectory>`` and
``swag_directions@<trajectory>``; one process runs them all, in that order, on
data it loads once (one DVC stage: a stage per probe cost more in start-up and
DVC bookkeeping than most probes compute).

A trajectory's centre is ``bayesavg.predictors.sampling.trajectory_centre`` (the SWA or HWA mean,
else the final weights). BatchNorm is recomputed at every point from the evaluate
stages' images; on a network with BatchNorm the SGD end therefore differs from the
map predictor, which keeps its trained statistics.

    python stages/landscape.py                 # every probe the params list
    python stages/landscape.py <kind> <name>   # one: plane, line, rays or swag_directions
"""

import sys
from pathlib import Path
from typing import Any

from _common import MANIFEST, PREPARED, main, params, tracked
from _sets import one_set

from bayesavg.config import Params
from bayesavg.runtime.errors import UserError
from bayesavg.runtime.io import write_csv, write_json

PLOTS = Path("plots/landscape")
METRICS = Path("metrics/landscape")
PLANES = Path("plots/plane")
KINDS = ("plane", "line", "rays", "swag_directions")


def _listed(p: Params, kind: str) -> list[str]:
    land = p.evaluate.landscape
    return {
        "plane": p.evaluate.plane.trajectories,
        "line": list(land.lines),
        "rays": land.rays.centres,
        "swag_directions": land.swag.trajectories,
    }[kind]


def _units(p: Params) -> list[tuple[str, str]]:
    """(kind, name) of the probes to run: all listed, or the one the command line names."""
    if len(sys.argv) == 1:
        return [(kind, name) for kind in KINDS for name in _listed(p, kind)]
    if len(sys.argv) != 3 or sys.argv[1] not in KINDS:
        raise UserError(f"usage: landscape.py [{{{'|'.join(KINDS)}}} <name>]")
    kind, name = sys.argv[1:]
    listed = _listed(p, kind)
    if name not in listed:
        raise UserError(
            f"landscape.py {kind}: {name!r} is not listed in evaluate.landscape or "
            f"evaluate.plane ({', '.join(listed) or 'none'})"
        )
    return [(kind, name)]


def _posterior_file(trajectory: str) -> Path:
    return Path("models") / trajectory / "posterior.pt"


def _unit_outputs(kind: str, name: str) -> list[Path]:
    """What a probe writes: its plot file or folder, and its summary (a plane's is in its
    folder). The one place that names them, so a failed run can take them all back."""
    if kind == "plane":
        return [PLANES / name]
    if kind == "swag_directions":
        return [PLOTS / "swag" / name, METRICS / "swag" / f"{name}.json"]
    return [PLOTS / kind / f"{name}.csv", METRICS / kind / f"{name}.json"]


class _Context:
    """The fixed data every landscape point is evaluated on, and the seeded parts: the same
    for every probe (every trajectory trains the params' one model), so built once."""

    _built: "_Context | None" = None

    @classmethod
    def of(cls, p: Params, like: Any) -> "_Context":
        if cls._built is None:
            cls._built = cls(p, like)
        return cls._built

    def __init__(self, p: Params, like: Any) -> None:
        from bayesavg.analyses.landscape import Probe
        from bayesavg.data.prepared import load_prepared
        from bayesavg.evaluation.evaluate import bn_inputs
        from bayesavg.seeding import derive_seed, resolve_device

        self.device = resolve_device(p.device, p.deterministic)
        data = load_prepared(PREPARED)
        land = p.evaluate.landscape
        part = data.train.random_subset(land.n_points, derive_seed(p.seed, "landscape"))
        # BatchNorm statistics at each point from the images the evaluate stages use, so
        # a line's end at a SWA mean equals the swa predictor's evaluation.
        bn_x = None
        if like.has_batchnorm:
            fraction = p.evaluate.bn_update_fraction
            bn_x = bn_inputs(like, data.train, fraction, p.seed, self.device)
        self.probe = Probe(
            train_x=like.model_input(part.x, self.device),
            train_y=part.y.to(self.device),
            test_x=like.inputs(data.test.x, self.device),
            test_y=data.test.y.to(self.device),
            bn_x=bn_x,
            weight_decay=p.pretrain.weight_decay,
            batch_size=p.evaluate.batch_size,
        )


def _line(p: Params, name: str) -> tuple[dict[str, Any], dict[str, float], list[Path]]:
    from bayesavg.analyses.landscape import line
    from bayesavg.models import for_inference
    from bayesavg.posteriors.file import load_posterior
    from bayesavg.predictors.sampling import trajectory_centre

    spec = p.evaluate.landscape.lines[name]
    a, b = load_posterior(_posterior_file(spec.a)), load_posterior(_posterior_file(spec.b))
    (a_kind, theta_a), (b_kind, theta_b) = trajectory_centre(a), trajectory_centre(b)
    ctx = _Context.of(p, a)
    rows = line(
        for_inference(a.build_model(ctx.device)),
        theta_a.to(ctx.device),
        theta_b.to(ctx.device),
        p.evaluate.landscape.t.values(),
        ctx.probe,
    )
    lowest = min(rows, key=lambda r: r["train_loss"])
    total = min(rows, key=lambda r: r["train_loss"] + r["weight_decay_term"])
    summary = {
        "a": spec.a,
        "b": spec.b,
        "a_centre": a_kind,
        "b_centre": b_kind,
        "distance": float((theta_b.double() - theta_a.double()).norm()),
        "t_min_train_loss": lowest["t"],
        "t_min_train_objective": total["t"],
        "weight_decay": p.pretrain.weight_decay,
    }
    csv, out = _unit_outputs("line", name)
    write_csv(csv, rows)
    write_json(out, summary)
    logged = {
        "distance": summary["distance"],
        "t_min_train_loss": lowest["t"],
        "t_min_train_objective": total["t"],
    }
    return summary, logged, [csv, out]


def _rays(p: Params, name: str) -> tuple[dict[str, Any], dict[str, float], list[Path]]:
    from bayesavg.analyses.landscape import filter_normalise, random_directions, ray, ray_width
    from bayesavg.models import for_inference
    from bayesavg.posteriors.file import load_posterior
    from bayesavg.predictors.sampling import trajectory_centre
    from bayesavg.seeding import derive_seed

    rp = p.evaluate.landscape.rays
    posterior = load_posterior(_posterior_file(name))
    kind, theta = trajectory_centre(posterior)
    ctx = _Context.of(p, posterior)
    model = for_inference(posterior.build_model(ctx.device))
    theta = theta.to(ctx.device)
    # The same seeded directions from every centre: the seed names no trajectory.
    directions = random_directions(theta.numel(), rp.directions, derive_seed(p.seed, "rays"))
    distances = rp.distances.values()
    rows, widths = [], []
    for i, d in enumerate(directions.to(ctx.device)):
        if rp.filter_normalise:
            d = filter_normalise(d, theta, model)
        found = ray(model, theta, d, distances, ctx.probe)
        widths.append(ray_width(model, theta, d, found, rp.delta, ctx.probe))
        rows += [{"direction": i, **row} for row in found]
    reached = [w for w in widths if w is not None]
    summary = {
        "trajectory": name,
        "centre": kind,
        "widths": widths,
        "width_mean": sum(reached) / len(reached) if len(reached) == len(widths) else None,
        "delta": rp.delta,
        "filter_normalised": rp.filter_normalise,
        "directions": rp.directions,
        "theta_norm": float(theta.double().norm()),
    }
    csv, out = _unit_outputs("rays", name)
    write_csv(csv, rows)
    write_json(out, summary)
    logged = {f"width_{i}": w for i, w in enumerate(widths) if w is not None}
    if summary["width_mean"] is not None:
        logged["width_mean"] = summary["width_mean"]
    return summary, logged, [csv, out]


def _swag_directions(p: Params, name: str) -> tuple[dict[str, Any], dict[str, float], list[Path]]:
    from bayesavg.analyses.landscape import principal_directions, ray
    from bayesavg.analyses.sweep import sigma_distance
    from bayesavg.models import for_inference
    from bayesavg.posteriors import SWAG
    from bayesavg.posteriors.file import load_posterior
    from bayesavg.seeding import derive_seed

    sp = p.evaluate.landscape.swag
    posterior = load_posterior(_posterior_file(name))
    if posterior.collector is None:
        raise UserError(f"swag_directions: trajectory {name!r} has no SWAG snapshots")
    ctx = _Context.of(p, posterior)
    model = for_inference(posterior.build_model(ctx.device))
    mean = SWAG.from_state_dict(posterior.collector, device=ctx.device).mean
    vectors, sigmas = principal_directions(posterior.collector, sp.directions)
    offsets = sp.offsets.values()
    rows = []
    for i, (v, sigma) in enumerate(zip(vectors, sigmas.tolist(), strict=True)):
        found = ray(model, mean, v.to(ctx.device), [m * sigma for m in offsets], ctx.probe)
        rows += [
            {"direction": i, "sigma": sigma, "offset": m, **row}
            for m, row in zip(offsets, found, strict=True)
        ]
    sigma_rows = sigma_distance(
        posterior,
        ctx.probe.test_x,
        ctx.probe.test_y,
        sp.sigma_multiples,
        sp.sigma_draws,
        derive_seed(p.seed, "sigma_distance", name),
        bn_x=ctx.probe.bn_x,
        batch_size=p.evaluate.batch_size,
    )
    folder, out = _unit_outputs("swag_directions", name)
    write_csv(folder / "directions.csv", rows)
    write_csv(folder / "sigma_distance.csv", sigma_rows)
    deviations = len(posterior.collector["deviations"])  # type: ignore[arg-type]
    summary = {"trajectory": name, "sigmas": sigmas.tolist(), "deviations": deviations}
    write_json(out, summary)
    logged = {f"sigma_{i}": s for i, s in enumerate(sigmas.tolist())}
    return summary, logged, [folder / "directions.csv", folder / "sigma_distance.csv", out]


def _plane(p: Params, name: str) -> tuple[dict[str, Any], dict[str, float], list[Path]]:
    from bayesavg.analyses.plane import loss_plane
    from bayesavg.data.prepared import load_prepared
    from bayesavg.models import for_inference
    from bayesavg.posteriors.file import load_posterior
    from bayesavg.seeding import derive_seed, resolve_device

    pp = p.evaluate.plane
    device = resolve_device(p.device, p.deterministic)
    data = load_prepared(PREPARED)
    posterior = load_posterior(_posterior_file(name))
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
    (out,) = _unit_outputs("plane", name)
    summary = {
        "trajectory": name,
        "start": p.finetune[name].start,
        "n_points": len(part),
        **result.summary(),
    }
    write_csv(out / "grid.csv", result.grid)
    write_csv(out / "path.csv", result.path)
    write_json(out / "summary.json", summary)
    ratio = summary["explained_variance_ratio"]
    logged = {
        "pc1_explained_variance_ratio": ratio[0],
        "pc2_explained_variance_ratio": ratio[1],
        "centre_loss": summary["centre_loss"],
        "centre_accuracy": summary["centre_accuracy"],
        "start_distance": summary["start_distance"],
        "snapshots": summary["n_snapshots"],
    }
    return summary, logged, [out / "grid.csv", out / "path.csv", out / "summary.json"]


RUNNERS = {"plane": _plane, "line": _line, "rays": _rays, "swag_directions": _swag_directions}


def _settings(p: Params, kind: str, name: str) -> tuple[list[Path], dict[str, Any]]:
    """A probe's input files and the settings its run logs."""
    land = p.evaluate.landscape
    if kind == "plane":
        logged = {
            "trajectory": name,
            "plane": p.evaluate.plane.model_dump(),
            "batch_size": p.evaluate.batch_size,
        }
        return [_posterior_file(name)], logged
    if kind == "line":
        spec = land.lines[name]
        inputs = [_posterior_file(spec.a), _posterior_file(spec.b)]
        settings: dict[str, Any] = {"line": spec.model_dump(), "t": land.t.model_dump()}
    else:
        inputs = [_posterior_file(name)]
        section = land.rays if kind == "rays" else land.swag
        settings = {"trajectory": name, kind: section.model_dump()}
    return inputs, {
        **settings,
        "n_points": land.n_points,
        "weight_decay": p.pretrain.weight_decay,
    }


def run() -> None:
    p = params()
    units = _units(p)
    # Every probe's files or none (a failure in the second leaves no first): the stage's
    # output folders when it runs all, else the one probe's files.
    outs = [PLOTS, METRICS, PLANES] if len(sys.argv) == 1 else _unit_outputs(*units[0])
    with one_set(outs, [f"{kind}@{name}" for kind, name in units]):
        for kind, name in units:
            inputs, logged = _settings(p, kind, name)
            with tracked(f"{kind}@{name}", p, logged, [MANIFEST, *inputs]) as mlrun:
                _, metrics, files = RUNNERS[kind](p, name)
                mlrun.log_metrics(metrics)
                folder = f"plane/{name}" if kind == "plane" else f"landscape/{kind}/{name}"
                for file in files:
                    mlrun.log_artifact(file, folder)
        # A kind with nothing listed (plane: trajectories: []) leaves its outputs DVC
        # expects as empty folders.
        for out in (PLOTS, METRICS, PLANES):
            out.mkdir(parents=True, exist_ok=True)


if __name__ == "__main__":
    main(run)
