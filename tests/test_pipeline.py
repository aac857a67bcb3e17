"""End to end: `dvc repro` on tiny params in a fresh git + DVC repo.

The params keep one trajectory of every kind and a predictor of every
registry method, on an MLP with BatchNorm (so sampling, BN update and BMA
run through the real stages). Checks the outputs, the MLflow runs (one per
stage execution, named after the stage, with tags and upstream links),
that every file a stage imported or read is a declared dep (traced), that
a second `dvc repro` does nothing, that a bad params.yaml stops the
pipeline before any output is touched, and that a Python without the
project fails in one line.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pipeline_repo import BIN, ROOT, default_params, env, make_repo, sh
from stage_deps import covered

from bayesavg.config.methods import REGISTRY

ENSEMBLE_MEMBERS = 2
KEPT_TRAJECTORIES = (
    "swag",
    "vi",
    "hwa",
    "mc_dropout",
    "ensemble",
    "multiswag",
    "sgld",
    "dswag",
    "laplace",
)
SEEDS = [0, 1]
PREDICTORS = {
    "map": {"trajectory": "mc_dropout", "method": "map"},
    "mc_dropout": {"trajectory": "mc_dropout", "method": "mc_dropout"},
    "swa": {"trajectory": "swag", "method": "swa"},
    "swag_diag": {"trajectory": "swag", "method": "swag_diag", "scale": 1.0},
    "swag": {"trajectory": "swag", "method": "swag", "scale": 0.5},
    "vi": {"trajectory": "vi", "method": "vi"},
    "hwa": {"trajectory": "hwa", "method": "hwa", "scale": 0.5},
    "hwa_mf": {"trajectory": "hwa", "method": "hwa_mf"},
    "hwa_rho": {"trajectory": "hwa", "method": "hwa_rho"},
    "ensemble": {"trajectory": "ensemble", "method": "ensemble"},
    "multiswa": {"trajectory": "multiswag", "method": "multiswa"},
    "multiswag": {"trajectory": "multiswag", "method": "multiswag", "scale": 0.5},
    "laplace": {"trajectory": "laplace", "method": "laplace"},
    "laplace_mc": {"trajectory": "laplace", "method": "laplace_mc"},
    "sgld": {"trajectory": "sgld", "method": "sgld"},
    "dswag": {"trajectory": "dswag", "method": "swag", "scale": 0.5},
}
PLANES = ["hwa"]
SWEEP = [1, 2]
LINES = {"mc_swag": {"a": "mc_dropout", "b": "swag"}}
RAYS = ["swag"]
SWAG_DIRECTIONS = ["dswag"]
SHIFTS = {"angles": [0.0, 90.0], "corruptions": ["shot_noise"], "n_points": 50}
# The MLflow runs of one execution: a stage's, or one per unit of a stage of several.
RUNS = {
    "data",
    "pretrain",
    "init",
    "report",
    *(f"{step}_seed@{s}" for s in SEEDS for step in ("finetune", "evaluate")),
    *(f"finetune@{t}" for t in KEPT_TRAJECTORIES),
    *(f"evaluate@{p}" for p in PREDICTORS),
    *(f"plane@{t}" for t in PLANES),
    *(f"dswag_sweep@{w}" for w in SWEEP),
    *(f"line@{n}" for n in LINES),
    *(f"rays@{t}" for t in RAYS),
    *(f"swag_directions@{t}" for t in SWAG_DIRECTIONS),
}
# dvc.yaml's stages: evaluate by trajectory, the sweep and the landscape probes in one
# each, and init's fresh network written by pretrain.
STAGES = {
    "data",
    "pretrain",
    "report",
    "dswag_sweep",
    "landscape",
    *(f"{step}_seed@{s}" for s in SEEDS for step in ("finetune", "evaluate")),
    *(f"finetune@{t}" for t in KEPT_TRAJECTORIES),
    *(f"evaluate@{spec['trajectory']}" for spec in PREDICTORS.values()),
}
# The runs `-S evaluate.predictors.swag.swag.scale=...` makes: its trajectory's predictors.
# With it, every seed's predictions (the pipeline's own: its marker), not its training.
SWAG_RUNS = {
    "evaluate@swa",
    "evaluate@swag_diag",
    "evaluate@swag",
    *(f"evaluate_seed@{s}" for s in SEEDS),
    "report",
}


def dvc_stage(run: str) -> str:
    """The DVC stage a run belongs to."""
    kind, _, name = run.partition("@")
    if kind == "evaluate":
        return f"evaluate@{PREDICTORS[name]['trajectory']}"
    if kind in ("plane", "line", "rays", "swag_directions"):
        return "landscape"
    return {"dswag_sweep": "dswag_sweep", "init": "pretrain"}.get(kind, run)


def files(pred: str) -> dict[str, Path]:
    """Where evaluate@<trajectory> writes predictor ``pred``'s files."""
    traj = PREDICTORS[pred]["trajectory"]
    return {
        "metrics": Path("metrics/evaluate") / traj / f"{pred}.json",
        "reliability": Path("plots/reliability") / traj / f"{pred}.csv",
        "samples": Path("plots/samples") / traj / f"{pred}.csv",
        "predictions": Path("predictions") / traj / f"{pred}.npz",
    }


def grouped(predictors: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Predictors as params.yaml lists them: by trajectory."""
    out: dict[str, dict[str, Any]] = {}
    for name, spec in predictors.items():
        out.setdefault(spec["trajectory"], {})[name] = {
            k: v for k, v in spec.items() if k != "trajectory"
        }
    return out


def tiny_params() -> dict[str, Any]:
    """The default params shrunk to seconds: a small BatchNorm MLP, 1-2 epochs, 3 samples,
    one trajectory of each kind (swag with SAM) and a predictor of every method."""
    raw = default_params()
    raw["device"] = "cpu"
    raw["seeds"] = SEEDS
    raw["model"] = {"name": "mlp", "hidden": [32], "batch_norm": True}
    raw["pretrain"]["epochs"] = 1
    raw["pretrain"]["members"] = ENSEMBLE_MEMBERS
    raw["finetune"] = {k: raw["finetune"][k] for k in KEPT_TRAJECTORIES}
    raw["finetune"]["swag"]["sam_rho"] = 0.05
    raw["finetune"]["laplace"].update(start="mc_dropout", batch_size=512)
    dswag = raw["finetune"]["dswag"]
    dswag.update(clients=3, batch_size=128, max_rank=5)
    dswag["phase1"]["rounds"] = 2
    dswag["phase2"].update(epochs=2, snapshots_per_client=2)
    raw["evaluate"]["dswag_sweep"].update(workers=SWEEP, rounds=2, sigma_draws=2)
    for traj in raw["finetune"].values():
        if traj.get("kind") in ("dswag", "laplace"):
            continue
        traj["epochs"] = 2
        traj["batch_size"] = 256
        traj["schedule"]["cycle_length"] = 4
        if "collect" in traj:
            traj["collect"] = {"start_epoch": 0, "every": 4, "max_rank": 5}
        if "members" in traj:
            traj["members"] = ENSEMBLE_MEMBERS
    raw["evaluate"]["n_samples"] = 3
    raw["evaluate"]["predictors"] = grouped(PREDICTORS)
    raw["evaluate"]["plane"].update(trajectories=PLANES, grid=5, n_points=200)
    raw["evaluate"]["shift"].update(SHIFTS)
    raw["evaluate"]["ood"]["n_points"] = 100
    land = raw["evaluate"]["landscape"]
    land.update(n_points=200, lines=LINES, t={"start": -1.0, "stop": 2.0, "points": 4})
    land["rays"].update(
        centres=RAYS, directions=2, distances={"start": 0.0, "stop": 20.0, "points": 3}
    )
    land["swag"].update(
        trajectories=SWAG_DIRECTIONS,
        offsets={"start": -2.0, "stop": 2.0, "points": 3},
        sigma_multiples=[0.0, 1.0],
        sigma_draws=2,
    )
    return raw


# The tiny pipeline's 44 stages, two at a time, take about 2.5 minutes on 2 cores before
# the first test, and its tests another 3: `make test-slow`, outside the 10-minute suite.
SLOW = pytest.mark.slow


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, traces: Path) -> Path:
    """The tiny pipeline, reproduced once as `make run` does (scripts/repro.py, two
    stages at a time) with every Python process traced."""
    repo = make_repo(tmp_path_factory.mktemp("pipeline"), tiny_params())
    traced = env(PYTHONPATH=str(ROOT / "tests" / "trace"), BAYESAVG_TRACE_DIR=str(traces))
    sh(repo, str(BIN / "python"), str(ROOT / "scripts/repro.py"), "--jobs", "2", environ=traced)
    return repo


def _candidates(repo: Path) -> set[str]:
    """The predictors the last report weighed for the registry's champion (its registered
    model's description lists every candidate)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    found = client.get_registered_model("bayesavg-mnist5k").description
    return {line.split(":")[0] for line in found.splitlines()[1:]}


def _runs(repo: Path) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bayesavg")
    assert exp is not None
    assert exp.artifact_location == (repo / "mlartifacts").as_uri()
    return client.search_runs([exp.experiment_id], max_results=1000)


def test_params_cover_every_method_and_kind() -> None:
    raw = tiny_params()
    assert {p["method"] for p in PREDICTORS.values()} == set(REGISTRY)
    assert grouped(PREDICTORS) == raw["evaluate"]["predictors"]
    kinds = {t.get("kind", "sgd") for t in raw["finetune"].values()}
    assert kinds == {"sgd", "vi", "hwa", "ensemble", "sgld", "dswag", "laplace"}
    assert any(t.get("sam_rho", 0) > 0 for t in raw["finetune"].values())


@SLOW
def test_outputs(repo: Path) -> None:
    for name in ("mc_dropout", "swag"):
        post = torch.load(repo / "models" / name / "posterior.pt", weights_only=True)
        assert post["model"]["name"] == "mlp"
        assert post["model"]["kwargs"]["batch_norm"] is True
        assert any(k.endswith("running_mean") for k in post["buffers"])
        assert post["input"]["shape"] == [1, 28, 28]
        assert post["num_classes"] == 10
    manifest = json.loads((repo / "data/prepared/manifest.json").read_text())
    n_train, n_val = manifest["splits"]["train"]["n"], manifest["splits"]["val"]["n"]
    assert n_train + n_val + manifest["splits"]["test"]["n"] == 5000
    swag = torch.load(repo / "models/swag/posterior.pt", weights_only=True)
    assert swag["collector"]["n_collected"] == 2 * math.ceil(n_train / 256) // 4
    start = torch.load(repo / "models/pretrain/posterior.pt", weights_only=True)
    assert torch.equal(swag["start_theta"], start["theta"])
    for pred, spec in PREDICTORS.items():
        metrics = json.loads((repo / files(pred)["metrics"]).read_text())
        assert {"accuracy", "nll", "ece", "ece15", "brier", "n"} <= set(metrics)
        assert metrics["n"] == 1000
        assert 0.5 < metrics["accuracy"] <= 1, pred
        m = ENSEMBLE_MEMBERS
        expected = {"map": 1, "swa": 1, "laplace": 1, "ensemble": m, "multiswa": m}
        expected["multiswag"] = 3 * m
        expected = expected.get(spec["method"], 3)
        assert metrics["n_samples"] == expected, pred
        assert math.isfinite(metrics["sharpness"]) and math.isfinite(metrics["hessian_trace"])
        assert 0 < metrics["hessian_trace_se"] < abs(metrics["hessian_trace"]), pred
        assert metrics["val"]["n"] == n_val
        rel = (repo / files(pred)["reliability"]).read_text().splitlines()
        assert rel[0].startswith("bin,lower,upper,confidence,accuracy,gap,count")
        assert len(rel) == 1 + 20
        assert sum(int(line.split(",")[-1]) for line in rel[1:]) == 1000
        samples = (repo / files(pred)["samples"]).read_text().splitlines()
        assert len(samples) == 1 + metrics["n_samples"]
    for traj in PLANES:
        grid = (repo / "plots/plane" / traj / "grid.csv").read_text().splitlines()
        assert len(grid) == 1 + 5 * 5
    pretrained = torch.load(repo / "models/pretrain/posterior.pt", weights_only=True)
    assert pretrained["samples"]["theta"].shape[0] == ENSEMBLE_MEMBERS
    assert torch.equal(pretrained["samples"]["theta"][0], pretrained["theta"])
    for name in KEPT_TRAJECTORIES:
        history = (repo / "plots/finetune" / f"{name}.csv").read_text().splitlines()
        if name == "laplace":  # nothing trains: its predictive on val, the prior found
            header = ["epoch", "val_loss", "val_accuracy", "prior_precision"]
            assert history[0].split(",") == header and len(history) == 2
            continue
        assert "test_accuracy" in history[0].split(",")
        assert len(history) == 1 + 2
    laplace = torch.load(repo / "models/laplace/posterior.pt", weights_only=True)
    mc = torch.load(repo / "models/mc_dropout/posterior.pt", weights_only=True)
    assert torch.equal(laplace["theta"], mc["theta"]) and laplace["laplace"]["n_data"] == n_train
    multi = torch.load(repo / "models/multiswag/posterior.pt", weights_only=True)
    assert len(multi["samples"]["collectors"]) == ENSEMBLE_MEMBERS
    ensemble = torch.load(repo / "models/ensemble/posterior.pt", weights_only=True)
    assert ensemble["samples"]["theta"].shape[0] == ENSEMBLE_MEMBERS
    sha = (repo / "models/pretrain/posterior.sha256").read_text().split()[0]
    from bayesavg.runtime.io import sha256_file

    assert sha == sha256_file(repo / "models/pretrain/posterior.pt")
    html = (repo / "reports/report.html").read_text()
    md = (repo / "reports/report.md").read_text()
    for pred in PREDICTORS:
        assert pred in html and pred in md
    assert not list((repo / "checkpoints").glob("*")), "finished stages delete their checkpoints"


@SLOW
def test_shift_and_ood_outputs(repo: Path) -> None:
    """Each predictor's shifts and OOD scores, and the per-point predictions behind them."""
    import numpy as np

    names = ["rotate_0", "rotate_90", "shot_noise"]
    for pred in PREDICTORS:
        metrics = json.loads((repo / files(pred)["metrics"]).read_text())
        assert list(metrics["shift"]) == names
        for row in metrics["shift"].values():
            assert set(row) == {"accuracy", "nll", "ece", "brier", "entropy"}
        scores = metrics["ood"]["animal_mnist"]
        assert set(scores) == {"msp", "entropy", "mutual_info"}
        assert all(0 <= v["auroc"] <= 1 for v in scores.values())
        with np.load(repo / files(pred)["predictions"]) as found:
            assert found["log_probs"].shape == (1000, 10)
            assert found["shift_y"].shape == (50,)
            assert {f"shift.{n}" for n in names} <= set(found.files)
            assert found["ood.animal_mnist.entropy"].shape == (100,)
            assert found["ood.test.entropy"].shape == (1000,)
            accuracy = (found["log_probs"].argmax(1) == found["y"]).mean()
        assert accuracy == pytest.approx(metrics["accuracy"], abs=1e-12)


@SLOW
def test_landscape_outputs(repo: Path) -> None:
    """The line's end at the SWA mean is the swa predictor's own evaluation (BatchNorm
    recomputed from the same images); rays and SWAG directions have their rows."""
    import csv

    def rows(path: Path) -> list[dict[str, float]]:
        with path.open() as f:
            return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]

    line = rows(repo / "plots/landscape/line/mc_swag.csv")
    assert [r["t"] for r in line] == [-1.0, 0.0, 1.0, 2.0]
    swa = json.loads((repo / files("swa")["metrics"]).read_text())
    end = next(r for r in line if r["t"] == 1.0)
    assert 1 - end["test_error"] == swa["accuracy"]
    assert end["test_nll"] == pytest.approx(swa["nll"], rel=1e-5)
    summary = json.loads((repo / "metrics/landscape/line/mc_swag.json").read_text())
    assert summary["a_centre"] == "weights" and summary["b_centre"] == "snapshot_mean"
    ray = rows(repo / "plots/landscape/rays/swag.csv")
    assert len(ray) == 2 * 3 and {r["distance"] for r in ray} == {0.0, 10.0, 20.0}
    widths = json.loads((repo / "metrics/landscape/rays/swag.json").read_text())["widths"]
    assert len(widths) == 2
    folder = repo / "plots/landscape/swag/dswag"
    assert len(rows(folder / "directions.csv")) == 2 * 3
    assert len(rows(folder / "sigma_distance.csv")) == 2 * 2


def _traced_stages(repo: Path, traces: Path) -> dict[str, dict[str, Any]]:
    """Each stage's trace record, matched to its dvc.lock entry by command."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    by_cmd = {entry["cmd"]: name for name, entry in lock.items()}
    records = {}
    for file in traces.glob("*.json"):
        record = json.loads(file.read_text())
        argv = record["argv"]
        if argv and argv[0].startswith("stages/"):
            records[by_cmd["python " + " ".join(argv)]] = record
    return records


def _project_path(path: str, repo: Path) -> str | None:
    """A path relative to the test repo, or to the project's src/ (the installed
    package); None for anything else (the venv, the system, temporary files)."""
    p = Path(path)
    for base, prefix in ((repo, ""), (ROOT / "src", "src/")):
        if p.is_relative_to(base):
            return prefix + p.relative_to(base).as_posix()
    return None


# Besides DVC's, git's and MLflow's own files: the run id files of other stages, which a
# stage reads only to tell its parent MLflow run which stages were reused (no output).
_NOT_PIPELINE = (
    ".git/",
    ".dvc/",
    "mlflow.db",
    "mlartifacts/",
    "checkpoints/",
    "runs/",
)


@SLOW
def test_stages_import_and_read_only_declared_deps(repo: Path, traces: Path) -> None:
    """What each stage process really imported and opened is declared in dvc.yaml."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    records = _traced_stages(repo, traces)
    assert set(records) == STAGES | {"validate"}
    for stage, record in records.items():
        deps = [d["path"] for d in lock[stage].get("deps", [])]
        outs = [o["path"] for o in lock[stage].get("outs", [])]
        used = {
            rel
            for path in record["read"] + record["modules"]
            if (rel := _project_path(path, repo)) is not None
            and "__pycache__" not in rel
            and not rel.startswith(_NOT_PIPELINE)
            and rel != "params.yaml"  # DVC tracks the stage's params by key
        }
        assert any(rel.startswith("src/bayesavg/") for rel in used), stage
        undeclared = sorted(rel for rel in used if not covered(rel, deps + outs))
        assert not undeclared, f"{stage} used files dvc.yaml does not declare: {undeclared}"


@SLOW
def test_stages_call_nothing_a_deterministic_cuda_run_refuses(repo: Path, traces: Path) -> None:
    """Every stage process (torchrun's ranks too), recorded from its import of torch on:
    no call of an operator CUDA refuses under deterministic algorithms
    (tests/cuda_determinism.py), so none stops a GPU run that passed here."""
    records = [
        record
        for file in traces.glob("*.json")
        if (record := json.loads(file.read_text()))["argv"][:1]
        and record["argv"][0].startswith("stages/")
    ]
    assert {" ".join(r["argv"]) for r in records} >= {
        "stages/finetune.py laplace",
        "stages/evaluate.py laplace",
        "stages/landscape.py",
        "stages/dswag_sweep.py",
    }
    with_torch = [r for r in records if any(m.endswith("/torch/__init__.py") for m in r["modules"])]
    assert len(with_torch) > len(STAGES) / 2 and all("cuda_refused" in r for r in with_torch)
    refused = {" ".join(r["argv"]): r["cuda_refused"] for r in records if r.get("cuda_refused")}
    assert refused == {}


def _stage_runs(runs: list[Any]) -> list[Any]:
    return [r for r in runs if "dvc_stage" in r.data.tags]


def _children(runs: list[Any], parent: Any) -> dict[str, Any]:
    return {
        r.info.run_name: r
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }


@SLOW
def test_mlflow_runs(repo: Path) -> None:
    everything = _runs(repo)
    runs = _stage_runs(everything)
    by_name = {r.info.run_name: r for r in runs}
    assert set(by_name) == RUNS
    assert len(runs) == len(RUNS)
    parents = [r for r in everything if "dvc_stage" not in r.data.tags]
    assert len(parents) == 1, "one parent run for the one dvc repro"
    parent = parents[0]
    assert parent.info.run_name.startswith("dvc repro ")
    assert parent.info.status == "FINISHED"
    assert _children(everything, parent) == by_name
    summary = json.loads(parent.data.tags["bayesavg.stages"])
    assert set(summary["ran"]) == RUNS and summary["reused"] == {}
    assert summary["ran"]["evaluate@swag"] == by_name["evaluate@swag"].info.run_id
    assert parent.data.tags["mlflow.source.type"] == "LOCAL"
    assert parent.data.tags["mlflow.source.name"] == "dvc repro"
    for name, run in by_name.items():
        assert run.info.status == "FINISHED"
        assert run.data.tags["dvc_stage"] == dvc_stage(name)
        assert len(run.data.tags["git_commit"]) >= 40
        assert "dvc_exp_name" not in run.data.tags, "an empty tag outside dvc exp run"
        record = json.loads((repo / f"runs/{name}.json").read_text())
        assert record["run_id"] == run.info.run_id and record["dvc_stage"] == dvc_stage(name)
    swag = by_name["evaluate@swag"]
    assert swag.data.tags["mlflow.source.name"] == "stages/evaluate.py"
    assert swag.data.tags["mlflow.source.type"] == "LOCAL"
    assert swag.info.user_id == swag.data.tags["mlflow.user"]
    manifest = json.loads((repo / "data/prepared/manifest.json").read_text())
    for stage in ("data", "evaluate@swag", "finetune@swag"):
        used = {
            (d.dataset.name, d.dataset.digest, d.tags[0].value)
            for d in by_name[stage].inputs.dataset_inputs
        }
        assert used == {
            (f"mnist5k-{split}", entry["sha256"][:36], split)
            for split, entry in manifest["splits"].items()
        }, stage
    assert swag.data.tags["upstream.finetune@swag"] == by_name["finetune@swag"].info.run_id
    assert swag.data.tags["upstream.data"] == by_name["data"].info.run_id
    hwa = by_name["finetune@hwa"]
    assert hwa.data.tags["upstream.finetune@vi"] == by_name["finetune@vi"].info.run_id
    assert by_name["finetune@vi"].data.tags["upstream.pretrain"] == by_name["pretrain"].info.run_id
    assert swag.data.params["predictor.method"] == "swag"
    assert {"test/accuracy", "test/nll", "test/ece", "test/brier", "val/nll"} <= set(
        swag.data.metrics
    )
    assert "shift/rotate_90/nll" in swag.data.metrics
    assert by_name["pretrain"].data.params["pretrain.epochs"] == "1"
    assert {"train/loss", "val/loss", "stage/compute_seconds"} <= set(
        by_name["pretrain"].data.metrics
    )
    report = by_name["report"]
    assert report.data.tags["upstream.evaluate@swag"] == swag.info.run_id
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    for pred in PREDICTORS:
        (output,) = by_name[f"evaluate@{pred}"].outputs.model_outputs
        assert client.get_logged_model(output.model_id).name == pred
    champion = client.get_model_version_by_alias("bayesavg-mnist5k", "champion")
    assert report.data.tags["registered_model"] == f"models:/bayesavg-mnist5k/{champion.version}"
    val_nll = {
        p: json.loads((repo / files(p)["metrics"]).read_text())["val"]["nll"] for p in PREDICTORS
    }
    assert champion.tags["predictor"] == min(val_nll, key=val_nll.get)
    artifacts = repo / "mlartifacts"
    assert any(artifacts.rglob("report.html"))
    assert any(artifacts.rglob("posterior.pt"))


def _out_files(repo: Path) -> list[Path]:
    """Every file of every DVC output in dvc.lock."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    paths = [repo / o["path"] for stage in lock.values() for o in stage.get("outs", [])]
    return [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*")))]


@SLOW
def test_outputs_hold_no_run_ids_or_wall_clock(repo: Path) -> None:
    """What changes with every execution stays out of the DVC outputs, whose bytes a
    rerun on any machine must reproduce: no run id, no timing column."""
    run_ids = [r.info.run_id for r in _runs(repo)]
    files = _out_files(repo)
    assert any(f.suffix == ".csv" for f in files) and any(f.suffix == ".md" for f in files)
    for f in files:
        if f.suffix not in (".json", ".csv", ".md", ".html", ".sha256"):
            continue
        text = f.read_text(encoding="utf-8")
        assert not [r for r in run_ids if r in text], f
        if f.suffix == ".csv":
            assert "seconds" not in text.splitlines()[0].split(","), f


@SLOW
def test_report_names_the_filter_of_every_run(repo: Path) -> None:
    """The report's list of runs (built from params) is what the execution made: every
    run, once, each with the filter that finds it; and each DVC stage tagged on them."""
    md = (repo / "reports/report.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| attributes\.run_name = '([^']+)' \|$", md, re.M)
    assert sorted(listed) == sorted(RUNS)
    runs = _stage_runs(_runs(repo))
    assert sorted(r.info.run_name for r in runs) == sorted(listed)
    assert {r.data.tags["dvc_stage"] for r in runs} == STAGES


@SLOW
def test_second_repro_does_nothing(repo: Path) -> None:
    before = len(_runs(repo))
    out = sh(repo, str(BIN / "dvc"), "repro").stdout
    assert "Running stage" not in out
    assert len(_runs(repo)) == before


@SLOW
def test_bytecode_caches_leave_deps_unchanged(repo: Path) -> None:
    """Python's __pycache__ next to the code (any user without PYTHONDONTWRITEBYTECODE)
    must not make the directory deps look modified."""
    sh(repo, str(BIN / "python"), "-m", "compileall", "-q", "src", "stages")
    assert list((repo / "src/bayesavg/posteriors").glob("__pycache__/*.pyc"))
    status = sh(repo, str(BIN / "dvc"), "status", "--json").stdout
    assert json.loads(status) == {}


@SLOW
def test_bad_params_stop_before_any_output(repo: Path) -> None:
    params = repo / "params.yaml"
    good = params.read_text()
    watched = [
        repo / files("swag")["metrics"],
        repo / "models/swag/posterior.pt",
        repo / "data/prepared",
    ]
    stamps = [(p.stat().st_mtime_ns, p.exists()) for p in watched]
    raw = yaml.safe_load(good)
    raw["evaluate"]["n_samples"] = 0
    raw["pretrain"]["epochs"] = 2
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    try:
        proc = sh(repo, str(BIN / "dvc"), "repro", check=False)
        assert proc.returncode != 0
        assert "params.yaml: evaluate.n_samples: Input should be greater than or equal to 1" in (
            proc.stderr + proc.stdout
        )
        assert "Traceback" not in proc.stderr + proc.stdout
        assert [(p.stat().st_mtime_ns, p.exists()) for p in watched] == stamps
        direct = sh(repo, str(BIN / "python"), "stages/validate.py", check=False)
        assert direct.returncode == 2
        assert direct.stderr.strip().count("\n") == 0
        assert direct.stderr.startswith("error: params.yaml: evaluate.n_samples")
    finally:
        params.write_text(good)
    assert "Running stage" not in sh(repo, str(BIN / "dvc"), "repro").stdout


@SLOW
def test_python_without_the_project_fails_in_one_line(repo: Path, tmp_path: Path) -> None:
    """`.venv/bin/dvc repro` without activating: the stage's `python` is one that
    cannot import bayesavg; it says so in one line, no traceback."""
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys._base_executable)  # type: ignore[attr-defined]
    outside = env(PATH=f"{bare}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = sh(repo, str(BIN / "dvc"), "repro", "--force", "validate", check=False, environ=outside)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output
    assert "cannot import bayesavg" in lines[0]
    assert "source .venv/bin/activate" in lines[0]
    sh(repo, str(BIN / "dvc"), "repro")


@SLOW
def test_temp_experiment_tracks_into_repo_store(repo: Path) -> None:
    """`dvc exp run --temp` runs in .dvc/tmp/exps; its runs must land in the repo's store,
    and its report weighs every predictor for the champion, the reused ones too."""
    before = {r.info.run_id for r in _runs(repo)}
    candidates = _candidates(repo)
    assert len(candidates) > len(SWAG_RUNS)
    change = "evaluate.predictors.swag.swag.scale=0.25"
    sh(repo, str(BIN / "dvc"), "exp", "run", "--temp", "-n", "narrower", "-S", change)
    everything = _runs(repo)
    new = [r for r in everything if r.info.run_id not in before]
    stages = {r.info.run_name: r for r in _stage_runs(new)}
    assert set(stages) == SWAG_RUNS
    assert all(r.data.tags["dvc_exp_name"] == "narrower" for r in new)
    (parent,) = [r for r in new if "dvc_stage" not in r.data.tags]
    assert parent.info.run_name == "narrower"
    assert _children(everything, parent) == stages
    summary = json.loads(parent.data.tags["bayesavg.stages"])
    assert set(summary["ran"]) == SWAG_RUNS
    first = {
        r.info.run_name: r.info.run_id for r in _stage_runs(everything) if r.info.run_id in before
    }
    assert summary["reused"]["finetune@swag"] == first["finetune@swag"]
    assert set(summary["reused"]) == RUNS - SWAG_RUNS
    assert not list((repo / ".dvc" / "tmp").rglob("mlflow.db"))
    assert _candidates(repo) == candidates


@pytest.mark.slow  # over a minute on 2 cores (two experiments, each every seed's predictions)
def test_queued_experiments_in_parallel_get_their_own_parents(repo: Path) -> None:
    """Two queued experiments run at once (``dvc queue start -j 2``): each has one parent
    run named after it, with its own stages as children; nothing is cross-linked."""
    import time

    before = {r.info.run_id for r in _runs(repo)}
    for name, scale in (("wide", "0.75"), ("wider", "1.0")):
        change = f"evaluate.predictors.swag.swag.scale={scale}"
        sh(repo, str(BIN / "dvc"), "exp", "run", "--queue", "-n", name, "-S", change)
    # `dvc queue start` waits for its workers, and a worker that was busy when the queue's
    # monitor saw it empty can stay idle for good (a race in DVC's celery queue, seen here
    # once in a while): poll the queue, then stop the workers and end the starter.
    starter = subprocess.Popen(
        [str(BIN / "dvc"), "queue", "start", "-j", "2"],
        cwd=repo,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    try:
        while True:
            status = sh(repo, str(BIN / "dvc"), "queue", "status").stdout
            if not any(word in status for word in ("Queued", "Running")):
                break
            assert time.monotonic() < deadline, status
            time.sleep(2)
    finally:
        sh(repo, str(BIN / "dvc"), "queue", "stop", check=False)
        try:
            starter.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(starter.pid, signal.SIGKILL)
            starter.wait()
    assert status.count("Success") >= 2, status
    everything = _runs(repo)
    new = [r for r in everything if r.info.run_id not in before]
    parents = {r.info.run_name: r for r in new if "dvc_stage" not in r.data.tags}
    assert set(parents) == {"wide", "wider"}
    for name, parent in parents.items():
        children = _children(everything, parent)
        assert set(children) == SWAG_RUNS, name
        assert all(c.data.tags["dvc_exp_name"] == name for c in children.values())
        scale = children["evaluate@swag"].data.params["predictor.scale"]
        assert scale == {"wide": "0.75", "wider": "1.0"}[name]


@SLOW
def test_seeds(repo: Path) -> None:
    """The pipeline's own seed is marked; seed 1 reruns every trajectory and predictor on
    the same split; the report averages both; changing a predictor reran seed 1's
    predictions only (test_temp_experiment...), never its training."""
    for step in ("models", "results"):
        own = json.loads((repo / "seeds/0" / step / "pipeline.json").read_text())
        assert own == {"seed": 0, "source": "pipeline"}
    again = json.loads((repo / "seeds/1/results/metrics.json").read_text())
    assert again["source"] == "replicate" and set(again["test"]) == set(PREDICTORS)
    for pred in PREDICTORS:
        assert again["test"][pred]["n"] == 1000 and 0.5 < again["test"][pred]["accuracy"] <= 1
    swag = json.loads((repo / files("swag")["metrics"]).read_text())
    assert again["test"]["swag"]["nll"] != swag["nll"], "seed 1 is another run"
    own_swag = torch.load(repo / "models/swag/posterior.pt", weights_only=True)
    seed_swag = torch.load(repo / "seeds/1/models/swag/posterior.pt", weights_only=True)
    assert not torch.equal(own_swag["theta"], seed_swag["theta"])
    import numpy as np

    with np.load(repo / "seeds/1/results/predictions.npz") as found:
        test_y = np.load(repo / files("map")["predictions"])["y"]
        assert np.array_equal(found["y"], test_y), "every seed predicts the same test images"
        for pred in PREDICTORS:
            probs = np.exp(found[pred].astype(np.float64)).sum(1)
            assert found[pred].shape == (1000, 10) and np.allclose(probs, 1, atol=1e-4)
    html = (repo / "reports/report.html").read_text()
    assert "Results over 2 seeds" in html and "mean ± std of 2 seeds (0, 1)" in html
    by_name = {r.info.run_name: r for r in _stage_runs(_runs(repo))}
    for step in ("finetune", "evaluate"):
        assert by_name[f"{step}_seed@1"].data.tags["seed"] == "1"
        assert by_name[f"{step}_seed@1"].data.params["seed"] == "1"
    assert by_name["evaluate@swag"].data.tags["seed"] == "0"


@SLOW
def test_stages_one_at_a_time_give_the_bytes_of_stages_side_by_side(repo: Path) -> None:
    """A plain `dvc repro -f` of stages the fixture ran beside others rewrites their
    outputs with the same bytes: dvc.lock's output hashes do not move. Last: the
    reruns are the newest runs of their stages, which earlier tests look up."""

    def outs() -> dict[str, Any]:
        lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
        return {name: lock[name]["outs"] for name in chosen}

    chosen = ("pretrain", "finetune@swag", "finetune@ensemble", "evaluate@swag")
    before = outs()
    for name in chosen:
        ran = sh(repo, str(BIN / "dvc"), "repro", "--single-item", "-f", name).stdout
        assert f"Running stage '{name}'" in ran
    assert outs() == before
    assert json.loads(sh(repo, str(BIN / "dvc"), "status", "--json").stdout) == {}
