"""End to end: `dvc repro` on tiny params in a fresh git + DVC repo.

Checks the outputs, the MLflow runs (one per stage execution, named after
the stage, with tags), that a second `dvc repro` does nothing, and that a
bad params.yaml stops the pipeline before any output is touched.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())
STAGES = {
    "data",
    "pretrain",
    "report",
    *(f"finetune@{t}" for t in PARAMS["finetune"]),
    *(f"evaluate@{p}" for p in PARAMS["evaluate"]["predictors"]),
    *(f"plane@{t}" for t in PARAMS["evaluate"]["plane"]["trajectories"]),
}
ENSEMBLE_MEMBERS = 2


def tiny_params() -> dict[str, Any]:
    """The default params, shrunk to seconds: a small MLP, 1-2 epochs, 3 samples."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["device"] = "cpu"
    raw["model"] = {"name": "mlp", "hidden": [32]}
    raw["pretrain"]["epochs"] = 1
    raw["pretrain"]["members"] = ENSEMBLE_MEMBERS
    for traj in raw["finetune"].values():
        traj["epochs"] = 2
        traj["batch_size"] = 256
        traj["schedule"]["cycle_length"] = 4
        if "collect" in traj:
            traj["collect"] = {"start_epoch": 0, "every": 4, "max_rank": 5}
        if "members" in traj:
            traj["members"] = ENSEMBLE_MEMBERS
    raw["evaluate"]["n_samples"] = 3
    raw["evaluate"]["plane"].update(grid=5, n_points=200)
    return raw


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    env["DVC_NO_ANALYTICS"] = "1"
    env["GIT_AUTHOR_NAME"] = env["GIT_COMMITTER_NAME"] = "test"
    env["GIT_AUTHOR_EMAIL"] = env["GIT_COMMITTER_EMAIL"] = "test@example.invalid"
    return env


def sh(repo: Path, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=repo, env=_env(), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git + DVC repo with the project's pipeline and tiny params, reproduced once."""
    repo = tmp_path_factory.mktemp("pipeline")
    shutil.copy(ROOT / "dvc.yaml", repo)
    shutil.copy(ROOT / ".gitignore", repo)
    shutil.copytree(ROOT / "stages", repo / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "src", repo / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "params.yaml").write_text(yaml.safe_dump(tiny_params(), sort_keys=False))
    sh(repo, "git", "init", "-q")
    sh(repo, str(BIN / "dvc"), "init", "-q")
    sh(repo, str(BIN / "dvc"), "config", "core.analytics", "false")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "init")
    sh(repo, str(BIN / "dvc"), "repro")
    return repo


def _runs(repo: Path) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bayesavg")
    assert exp is not None
    assert exp.artifact_location == (repo / "mlartifacts").as_uri()
    return client.search_runs([exp.experiment_id], max_results=1000)


def test_outputs(repo: Path) -> None:
    for name in ("sgd", "swag"):
        post = torch.load(repo / "models" / name / "posterior.pt", weights_only=True)
        assert post["model"] == {"name": "mlp", "kwargs": {"hidden": [32]}}
        assert post["input"]["shape"] == [1, 28, 28]
        assert post["num_classes"] == 10
    manifest = json.loads((repo / "data/prepared/manifest.json").read_text())
    n_train, n_val = manifest["splits"]["train"]["n"], manifest["splits"]["val"]["n"]
    assert n_train + n_val + manifest["splits"]["test"]["n"] == 5000
    swag = torch.load(repo / "models/swag/posterior.pt", weights_only=True)["collector"]
    assert swag["n_collected"] == 2 * math.ceil(n_train / 256) // 4
    for pred in PARAMS["evaluate"]["predictors"]:
        metrics = json.loads((repo / "metrics" / f"{pred}.json").read_text())
        assert {"accuracy", "nll", "ece", "ece15", "brier", "n"} <= set(metrics)
        assert metrics["n"] == 1000
        assert 0.5 < metrics["accuracy"] <= 1
        method = PARAMS["evaluate"]["predictors"][pred]["method"]
        expected = {"map": 1, "swa": 1, "ensemble": ENSEMBLE_MEMBERS}.get(method, 3)
        assert metrics["n_samples"] == expected, pred
        assert math.isfinite(metrics["sharpness"]) and math.isfinite(metrics["hessian_trace"])
        assert metrics["val"]["n"] == n_val
        rel = (repo / "plots/reliability" / f"{pred}.csv").read_text().splitlines()
        assert rel[0].startswith("bin,lower,upper,confidence,accuracy,gap,count")
        assert len(rel) == 1 + 20
        assert sum(int(line.split(",")[-1]) for line in rel[1:]) == 1000
        samples = (repo / "plots/samples" / f"{pred}.csv").read_text().splitlines()
        assert len(samples) == 1 + metrics["n_samples"]
    for traj in PARAMS["evaluate"]["plane"]["trajectories"]:
        grid = (repo / "plots/plane" / traj / "grid.csv").read_text().splitlines()
        assert len(grid) == 1 + 5 * 5
    pretrained = torch.load(repo / "models/pretrain/posterior.pt", weights_only=True)
    assert pretrained["samples"]["theta"].shape[0] == ENSEMBLE_MEMBERS
    assert torch.equal(pretrained["samples"]["theta"][0], pretrained["theta"])
    for name, traj in PARAMS["finetune"].items():
        history = (repo / "plots/finetune" / f"{name}.csv").read_text().splitlines()
        assert "test_accuracy" in history[0].split(",")
        assert len(history) == 1 + 2
        if traj.get("kind") == "ensemble":
            post = torch.load(repo / "models" / name / "posterior.pt", weights_only=True)
            assert post["samples"]["theta"].shape[0] == ENSEMBLE_MEMBERS
    sha = (repo / "models/pretrain/posterior.sha256").read_text().split()[0]
    from bayesavg.io import sha256_file

    assert sha == sha256_file(repo / "models/pretrain/posterior.pt")
    html = (repo / "reports/report.html").read_text()
    md = (repo / "reports/report.md").read_text()
    for pred in PARAMS["evaluate"]["predictors"]:
        assert pred in html and pred in md


def test_mlflow_runs(repo: Path) -> None:
    runs = _runs(repo)
    by_name = {r.info.run_name: r for r in runs}
    assert set(by_name) == STAGES
    assert len(runs) == len(STAGES)
    for stage, run in by_name.items():
        assert run.info.status == "FINISHED"
        assert run.data.tags["dvc_stage"] == stage
        assert len(run.data.tags["git_commit"]) >= 40
        run_file = repo / ("reports/run.json" if stage == "report" else f"runs/{stage}.json")
        assert json.loads(run_file.read_text())["run_id"] == run.info.run_id
    swag = by_name["evaluate@swag"]
    assert swag.data.tags["upstream.finetune@swag"] == by_name["finetune@swag"].info.run_id
    assert swag.data.params["predictor.method"] == "swag"
    assert {"accuracy", "nll", "ece", "brier", "val_nll"} <= set(swag.data.metrics)
    assert by_name["pretrain"].data.params["pretrain.epochs"] == "1"
    assert "train_loss" in by_name["pretrain"].data.metrics
    artifacts = repo / "mlartifacts"
    assert any(artifacts.rglob("report.html"))
    assert any(artifacts.rglob("posterior.pt"))


def test_second_repro_does_nothing(repo: Path) -> None:
    before = len(_runs(repo))
    out = sh(repo, str(BIN / "dvc"), "repro").stdout
    assert "Running stage" not in out
    assert len(_runs(repo)) == before


def test_bad_params_stop_before_any_output(repo: Path) -> None:
    params = repo / "params.yaml"
    good = params.read_text()
    watched = [
        repo / "metrics/swag.json",
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


def test_temp_experiment_tracks_into_repo_store(repo: Path) -> None:
    """`dvc exp run --temp` runs in .dvc/tmp/exps; its runs must land in the repo's store."""
    before = {r.info.run_id for r in _runs(repo)}
    change = "evaluate.predictors.swag.scale=0.25"
    sh(repo, str(BIN / "dvc"), "exp", "run", "--temp", "-n", "narrower", "-S", change)
    new = [r for r in _runs(repo) if r.info.run_id not in before]
    assert {r.info.run_name for r in new} == {"evaluate@swag", "report"}
    assert all(r.data.tags["dvc_exp_name"] == "narrower" for r in new)
    assert not list((repo / ".dvc" / "tmp").rglob("mlflow.db"))
