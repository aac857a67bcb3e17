"""A throw-away git + DVC repo holding the project's pipeline, for end-to-end tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DVC = str(BIN / "dvc")
PYTHON = str(BIN / "python")


def env(**extra: str) -> dict[str, str]:
    """The test's environment for DVC and stages: the venv first on PATH, no inherited
    MLflow or DVC settings, telemetry off, a git identity."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    out["PATH"] = f"{BIN}{os.pathsep}{out.get('PATH', '')}"
    out["MLFLOW_DISABLE_TELEMETRY"] = "true"
    out["DVC_NO_ANALYTICS"] = "1"
    out["GIT_AUTHOR_NAME"] = out["GIT_COMMITTER_NAME"] = "test"
    out["GIT_AUTHOR_EMAIL"] = out["GIT_COMMITTER_EMAIL"] = "test@example.invalid"
    out.update(extra)
    return out


def sh(
    repo: Path, *cmd: str, check: bool = True, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=repo, env=environ or env(), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


PIPELINE_FILES = ("dvc.yaml", ".gitignore", "stages", "src", "networks")


def write_pipeline(repo: Path, params: dict[str, Any]) -> None:
    """The project's pipeline files and ``params`` in ``repo`` (``model.code`` and
    ``model.weights`` filled in where a model section leaves them out: dvc.yaml reads
    them). Shared by ``make_repo`` and gpu-check's scratch repo, which may lack git."""
    model = params.setdefault("model", {})
    model.setdefault("code", "networks")
    model.setdefault("weights", None)
    ignore = shutil.ignore_patterns("__pycache__")
    for name in PIPELINE_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, repo / name, ignore=ignore)
        else:
            shutil.copy(ROOT / name, repo / name)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def make_repo(repo: Path, params: dict[str, Any]) -> Path:
    """A git + DVC repo with the project's pipeline and ``params``, not yet reproduced."""
    write_pipeline(repo, params)
    sh(repo, "git", "init", "-q")
    sh(repo, DVC, "init", "-q")
    shutil.copy(ROOT / ".dvcignore", repo)
    sh(repo, DVC, "config", "core.analytics", "false")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "init")
    return repo


def prune_landscape(raw: dict[str, Any]) -> dict[str, Any]:
    """Drop the landscape entries of trajectories a test removed from ``finetune`` (the
    defaults name sgd, swag, fswag, hwa, fhwa, dswag, fedavg_swag)."""
    kept = set(raw["finetune"])
    land = raw["evaluate"]["landscape"]
    land["lines"] = {k: v for k, v in land["lines"].items() if {v["a"], v["b"]} <= kept}
    land["rays"]["centres"] = [t for t in land["rays"]["centres"] if t in kept]
    land["swag"]["trajectories"] = [t for t in land["swag"]["trajectories"] if t in kept]
    return raw


def default_params() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def small_params(epochs: int, pretrain_epochs: int, members: int) -> dict[str, Any]:
    """The default params on a 16-unit BatchNorm MLP, every trajectory kept but short:
    ``epochs`` at batch 256, cycles and snapshots every 5 steps (at most 4 kept),
    ``members`` pretrained networks for the ensembles; distributed SWAG on 4 clients."""
    raw = default_params()
    raw["model"] = {"name": "mlp", "hidden": [16], "batch_norm": True}
    raw["pretrain"].update(epochs=pretrain_epochs, batch_size=256, members=members)
    for traj in raw["finetune"].values():
        if traj.get("kind") == "dswag":  # 4 clients, `epochs` rounds, 2 exploring epochs
            traj.update(clients=4, batch_size=64, max_rank=4)
            traj["phase1"]["rounds"] = epochs
            traj["phase2"].update(epochs=2, snapshots_per_client=2)
            continue
        if traj.get("kind") == "laplace":  # trains nothing: one fit over the training split
            traj["batch_size"] = 512
            continue
        traj.update(epochs=epochs, batch_size=256)
        traj["schedule"]["cycle_length"] = 5
        if "collect" in traj:
            traj["collect"] = {"start_epoch": 0, "every": 5, "max_rank": 4}
        if "members" in traj:
            traj["members"] = members
    return raw
