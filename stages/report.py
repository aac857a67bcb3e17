"""Stage `report`: every predictor's results into reports/report.{html,md}."""

import csv
import json
from pathlib import Path

from _common import MANIFEST, RUNS, main, params, raw_params, tracked

from bayesavg.config import Params
from bayesavg.report import (
    PlaneData,
    PredictorResult,
    ReportInputs,
    SweepPoint,
    pair_predictors,
    write_report,
)

OUT = Path("reports")
PLANES = Path("plots/plane")
SWEEP_METRICS = Path("metrics/dswag_sweep")
SWEEP_PLOTS = Path("plots/dswag_sweep")


def _csv(path: Path) -> list[dict[str, float]]:
    with path.open(newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


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
        {name: (pred.method, pred.trajectory) for name, pred in p.evaluate.predictors.items()},
        {name: traj.start for name, traj in p.finetune.items()},
    )


def _planes(p: Params) -> dict[str, PlaneData]:
    """The loss planes of the listed trajectories that the plane stage has written."""
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
        folder = SWEEP_PLOTS / str(w)
        points.append(
            SweepPoint(
                workers=int(found["workers"]),
                rounds=int(found["rounds"]),
                rounds_to_target=found["rounds_to_target"],
                target_accuracy=float(found["target_accuracy"]),
                snapshots=int(found["snapshots"]),
                metrics={k: found.get(k) for k in ("fedavg", "dswa", "dswag")},
                history=_csv(folder / "rounds.csv"),
                sigma_distance=_csv(folder / "sigma_distance.csv"),
            )
        )
    return points


def run() -> None:
    p = params()
    predictors = [
        PredictorResult(
            name=name,
            method=pred.method,
            trajectory=pred.trajectory,
            scale=pred.effective_scale(),
            metrics=json.loads((Path("metrics") / f"{name}.json").read_text()),
            reliability=_csv(Path("plots/reliability") / f"{name}.csv"),
            by_samples=_csv(Path("plots/samples") / f"{name}.csv"),
        )
        for name, pred in p.evaluate.predictors.items()
    ]
    histories = {"pretrain": _csv(Path("plots/pretrain.csv"))}
    histories.update({t: _csv(Path("plots/finetune") / f"{t}.csv") for t in p.finetune})
    run_ids = {
        f.stem: json.loads(f.read_text())["run_id"]
        for f in sorted(RUNS.glob("*.json"))
        if f.stem != "validate"
    }
    manifest = json.loads(MANIFEST.read_text())
    inputs = ReportInputs(
        title=p.report.title,
        predictors=predictors,
        histories=histories,
        params=raw_params(),
        run_ids=run_ids,
        baseline="map" if "map" in p.evaluate.predictors else next(iter(p.evaluate.predictors)),
        notes=p.report.notes,
        pairs=_pairs(p),
        planes=_planes(p),
        dswag_sweep=_sweep(p),
        dataset_summary={
            "dataset": manifest["dataset"],
            **{s: manifest["splits"][s]["n"] for s in ("train", "val", "test")},
            "input_shape": manifest["input_shape"],
        },
    )
    upstream = {f"upstream.{stage}": run_id for stage, run_id in run_ids.items()}
    logged = {"report": p.report.model_dump()}
    with tracked("report", p, logged, id_file=OUT / "run.json", tags=upstream) as mlrun:
        paths = write_report(inputs, OUT)
        for path in paths.values():
            mlrun.log_artifact(path, "report")


if __name__ == "__main__":
    main(run)
