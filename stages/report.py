"""Stage `report`: every predictor's results into reports/report.{html,md}."""

import csv
import json
import re
from pathlib import Path

from _common import (
    MANIFEST,
    main,
    params,
    predictor_files,
    raw_params,
    reused_runs,
    tracked,
)

from bayesavg.config import Params
from bayesavg.report import (
    Landscape,
    LineData,
    PlaneData,
    Predictions,
    PredictorResult,
    RayData,
    ReportInputs,
    SeedRun,
    SwagDirections,
    SweepPoint,
    pair_predictors,
    write_report,
)

OUT = Path("reports")
SEED_METRICS = ("accuracy", "nll", "ece", "brier")
PLANES = Path("plots/plane")
SWEEP_METRICS = Path("metrics/dswag_sweep")
SWEEP_PLOTS = Path("plots/dswag_sweep")
LANDSCAPE_PLOTS = Path("plots/landscape")
LANDSCAPE_METRICS = Path("metrics/landscape")


def _csv(path: Path) -> list[dict[str, float]]:
    with path.open(newline="") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def _cell(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _table(path: Path) -> list[dict[str, float | str]]:
    """CSV rows with numbers as floats and anything else (a row's kind) kept as text."""
    with path.open(newline="") as f:
        return [{k: _cell(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _pairs(p: Params) -> list[tuple[str, str]]:
    """F-variants beside their baseline, HWA beside the VI it starts from."""
    return pair_predictors(
        {name: (pred.method, pred.trajectory) for name, pred in p.evaluate.by_name.items()},
        {name: traj.start for name, traj in p.finetune.items()},
    )


def _planes(p: Params) -> dict[str, PlaneData]:
    """The loss planes of the listed trajectories that stage landscape has written."""
    planes = {}
    for name in p.evaluate.plane.trajectories:
        folder = PLANES / name
        if (folder / "grid.csv").is_file():
            planes[name] = PlaneData(
                grid=_csv(folder / "grid.csv"),
                path=_table(folder / "path.csv"),
                summary=json.loads((folder / "summary.json").read_text()),
            )
    return planes


def _sweep(p: Params) -> list[SweepPoint]:
    """The DSWAG worker sweep, in increasing W, for the listed W the sweep has written."""
    points = []
    for w in sorted(p.evaluate.dswag_sweep.workers):
        file = SWEEP_METRICS / f"{w}.json"
        if not file.is_file():
            continue
        found = json.loads(file.read_text())
        points.append(
            SweepPoint(
                workers=int(found["workers"]),
                rounds=int(found["rounds"]),
                rounds_to_target=found["rounds_to_target"],
                target_accuracy=float(found["target_accuracy"]),
                snapshots=int(found["snapshots"]),
                metrics={k: found.get(k) for k in ("fedavg", "dswa", "dswag")},
                history=_csv(SWEEP_PLOTS / "rounds" / f"{w}.csv"),
                sigma_distance=_csv(SWEEP_PLOTS / "sigma_distance" / f"{w}.csv"),
            )
        )
    return points


def _predictions(file: Path) -> Predictions | None:
    """A predictor's per-point predictions (``predictions/<trajectory>/<name>.npz``), if
    written."""
    import numpy as np

    if not file.is_file():
        return None
    with np.load(file, allow_pickle=False) as found:
        arrays = {key: found[key] for key in found.files}
    ood: dict[str, dict[str, np.ndarray]] = {}
    for key, values in arrays.items():
        if key.startswith("ood."):
            where, _, score = key.removeprefix("ood.").rpartition(".")
            ood.setdefault(where, {})[score] = values
    return Predictions(
        y=arrays["y"],
        log_probs=arrays["log_probs"],
        shift_y=arrays.get("shift_y"),
        shift_log_probs={
            k.removeprefix("shift."): v for k, v in arrays.items() if k.startswith("shift.")
        },
        ood_scores=ood,
    )


def _seeds(p: Params, predictors: list[PredictorResult]) -> list[SeedRun]:
    """Every seed's test results: the pipeline's own from its predictors, every other
    seed's from ``seeds/<s>/results`` (written by evaluate_seed@<s>)."""
    import numpy as np

    found = []
    for seed in p.seeds:
        root = Path("seeds") / str(seed) / "results"
        if (root / "pipeline.json").is_file():
            own = {r.name: {k: r.metric(k) for k in SEED_METRICS} for r in predictors}
            found.append(SeedRun(seed, own))
            continue
        metrics = json.loads((root / "metrics.json").read_text())["test"]
        npz = root / "predictions.npz"
        arrays: dict[str, np.ndarray] = {}
        if npz.is_file():
            with np.load(npz, allow_pickle=False) as loaded:
                arrays = {key: loaded[key] for key in loaded.files}
        y = arrays.pop("y", None)
        found.append(SeedRun(seed, metrics, arrays, y))
    return found


def _landscape(p: Params) -> Landscape | None:
    """Every landscape probe stage landscape has written; None if none has."""
    land = p.evaluate.landscape
    lines = {}
    for name in land.lines:
        summary = LANDSCAPE_METRICS / "line" / f"{name}.json"
        if summary.is_file():
            found = json.loads(summary.read_text())
            lines[name] = LineData(
                a=found["a"],
                b=found["b"],
                a_centre=found["a_centre"],
                b_centre=found["b_centre"],
                rows=_csv(LANDSCAPE_PLOTS / "line" / f"{name}.csv"),
            )
    rays = {}
    for name in land.rays.centres:
        summary = LANDSCAPE_METRICS / "rays" / f"{name}.json"
        if summary.is_file():
            found = json.loads(summary.read_text())
            rays[name] = RayData(
                trajectory=name,
                centre=found["centre"],
                rows=_csv(LANDSCAPE_PLOTS / "rays" / f"{name}.csv"),
                widths=found["widths"],
                delta=found["delta"],
                filter_normalised=found["filter_normalised"],
            )
    swag = {}
    for name in land.swag.trajectories:
        folder = LANDSCAPE_PLOTS / "swag" / name
        if (folder / "directions.csv").is_file():
            swag[name] = SwagDirections(
                trajectory=name,
                directions=_csv(folder / "directions.csv"),
                sigma_distance=_csv(folder / "sigma_distance.csv"),
            )
    if not (lines or rays or swag):
        return None
    return Landscape(lines=lines, rays=rays, swag=swag)


def tracked_runs(p: Params) -> list[str]:
    """The MLflow runs of a pipeline execution for these params (a stage's, or a unit's of
    a stage that runs several), in pipeline order."""
    ev, land = p.evaluate, p.evaluate.landscape
    return [
        "data",
        "pretrain",
        "init",
        *(f"finetune@{t}" for t in p.finetune),
        *(f"evaluate@{n}" for n in ev.by_name),
        *(f"dswag_sweep@{w}" for w in ev.dswag_sweep.workers),
        *(f"plane@{t}" for t in ev.plane.trajectories),
        *(f"line@{n}" for n in land.lines),
        *(f"rays@{c}" for c in land.rays.centres),
        *(f"swag_directions@{t}" for t in land.swag.trajectories),
        *(f"{step}_seed@{s}" for s in p.seeds for step in ("finetune", "evaluate")),
        "report",
    ]


def run() -> None:
    p = params()
    predictors = [
        PredictorResult(
            name=name,
            method=pred.method,
            trajectory=pred.trajectory,
            scale=pred.effective_scale(),
            metrics=json.loads(files.metrics.read_text()),
            reliability=_csv(files.reliability),
            by_samples=_csv(files.samples),
            predictions=_predictions(files.predictions),
        )
        for name, pred in p.evaluate.by_name.items()
        for files in [predictor_files(pred.trajectory, name)]
    ]
    histories = {"pretrain": _csv(Path("plots/pretrain.csv"))}
    histories.update({t: _csv(Path("plots/finetune") / f"{t}.csv") for t in p.finetune})
    # The run behind each stage's outputs (not DVC outputs): for MLflow's links and the
    # registry, never for the report. In a temporary or queued experiment's workspace only
    # the stages it ran have their run files; the reused ones are the project's.
    run_ids = {name: rid for name, rid in reused_runs("report").items() if name != "validate"}
    manifest = json.loads(MANIFEST.read_text())
    inputs = ReportInputs(
        title=p.report.title,
        predictors=predictors,
        histories=histories,
        params=raw_params(),
        runs=tracked_runs(p),
        baseline="map" if "map" in p.evaluate.by_name else next(iter(p.evaluate.by_name)),
        notes=p.report.notes,
        pairs=_pairs(p),
        planes=_planes(p),
        dswag_sweep=_sweep(p),
        landscape=_landscape(p),
        seeds=_seeds(p, predictors),
        dataset_summary={
            "dataset": manifest["dataset"],
            **{s: manifest["splits"][s]["n"] for s in ("train", "val", "test")},
            "input_shape": manifest["input_shape"],
        },
    )
    upstream = {f"upstream.{stage}": run_id for stage, run_id in run_ids.items()}
    logged = {"report": p.report.model_dump()}
    with tracked("report", p, logged, tags=upstream) as mlrun:
        paths = write_report(inputs, OUT)
        for path in paths.values():
            mlrun.log_artifact(path, "report")
        # The best predictor by validation NLL becomes the registry's champion.
        candidates = {
            r.name: {"run_id": run_ids[f"evaluate@{r.name}"], "val_nll": r.metrics["val"]["nll"]}
            for r in predictors
            if f"evaluate@{r.name}" in run_ids
        }
        if candidates:
            dataset = re.sub(r"[^A-Za-z0-9_.-]+", "_", manifest["dataset"])
            mlrun.register_best(f"bayesavg-{dataset}", candidates)


if __name__ == "__main__":
    main(run)
