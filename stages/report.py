"""Stage `report`: every predictor's results into reports/report.{html,md}."""

import csv
import json
from pathlib import Path

from _common import RUNS, main, params, raw_params, tracked

from bayesavg.report import PredictorResult, ReportInputs, write_report

OUT = Path("reports")


def _csv(path: Path) -> list[dict[str, float]]:
    with path.open(newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _pairs(predictors: dict) -> list[tuple[str, str]]:
    """Each flat-seeking predictor beside its baseline, and HWA variants beside vi."""
    pairs = [
        (name[1:], name) for name in predictors if name.startswith("f") and name[1:] in predictors
    ]
    pairs += [("vi", name) for name in predictors if name.startswith("hwa") and "vi" in predictors]
    return pairs


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
    manifest = json.loads(Path("data/prepared/manifest.json").read_text())
    inputs = ReportInputs(
        title=p.report.title,
        predictors=predictors,
        histories=histories,
        params=raw_params(),
        run_ids=run_ids,
        baseline="map" if "map" in p.evaluate.predictors else next(iter(p.evaluate.predictors)),
        notes=p.report.notes,
        pairs=_pairs(p.evaluate.predictors),
        dataset_summary={
            "dataset": manifest["dataset"],
            **{s: manifest["splits"][s]["n"] for s in ("train", "val", "test")},
            "input_shape": manifest["input_shape"],
        },
    )
    upstream = sorted(run_ids)
    with tracked(
        "report", p, {"report": p.report.model_dump()}, upstream, OUT / "run.json"
    ) as mlrun:
        paths = write_report(inputs, OUT)
        for path in paths.values():
            mlrun.log_artifact(path, "report")


if __name__ == "__main__":
    main(run)
