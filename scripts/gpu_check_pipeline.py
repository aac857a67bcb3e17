"""The ``pipeline`` part of ``scripts/gpu_check.py --pipeline``: the default pipeline at
toy sizes through ``dvc repro`` with ``device: cuda``, in a scratch repo.

Its own invocation (and its own time box): every stage is a process of its own that
imports torch and MLflow and starts CUDA, so the whole pipeline costs minutes even at
toy sizes, and a failing stage must not cost the in-process measurements.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import stage_ledger
import yaml
from gpu_check_runner import KEPT_REPO, NO_CUDA, TARGETS, Context, PartError

ROOT = Path(__file__).resolve().parents[1]
PIPELINE_METRICS = {"map": "sgd", "swa": "swag", "swag": "swag"}  # predictor: its trajectory
TAIL_LINES = 40


def targets() -> list[str]:
    """``gpu_check.py --targets``: the stages to reproduce, with all they depend on."""
    return os.environ.get(TARGETS, "").split()


def _tests_module() -> Any:
    """``tests/pipeline_repo.py``: the tests' own pipeline repo and shrinking, not a copy."""
    sys.path.insert(0, str(ROOT / "tests"))
    import pipeline_repo

    return pipeline_repo


def toy_pipeline(device: str) -> dict[str, Any]:
    """The default params shrunk to a smoke run of every stage: the end-to-end tests'
    small BatchNorm MLP, one or two epochs, few samples and points, on ``device``."""
    small_params = _tests_module().small_params

    small = small_params(epochs=2, pretrain_epochs=1, members=2)
    small["device"] = device
    e = small["evaluate"]
    e.update(n_samples=3)
    e["shift"]["n_points"] = 50
    e["ood"]["n_points"] = 100
    e["plane"].update(grid=3, n_points=100)
    e["dswag_sweep"].update(workers=[1, 2], rounds=2, sigma_draws=2)
    e["sharpness"].update(n_points=100, probes=1)
    e["landscape"].update(n_points=100, t={"start": -1.0, "stop": 2.0, "points": 3})
    e["landscape"]["rays"]["distances"]["points"] = 3
    e["landscape"]["swag"]["offsets"]["points"] = 3
    return small


def stage_env(repo: Path) -> dict[str, str]:
    """The stages' environment: ``python`` on PATH is this interpreter (the GPU machine
    may have only ``python3``; a venv's own is kept), the scratch repo's ``src`` first on
    PYTHONPATH, MLflow in the repo, no inherited MLflow or DVC settings, unbuffered
    output (stage lines arrive as they are printed), telemetry off, a git identity."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    shim = repo / ".gpu-check-bin"
    shim.mkdir(exist_ok=True)
    (shim / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shim / "python").chmod(0o755)
    out["PATH"] = os.pathsep.join([str(shim), out.get("PATH", "")])
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo / "src"), out.get("PYTHONPATH")) if p)
    out["PYTHONUNBUFFERED"] = "1"
    out["MLFLOW_TRACKING_URI"] = f"sqlite:///{repo / 'mlflow.db'}"
    out["MLFLOW_DISABLE_TELEMETRY"] = "true"
    out["DVC_NO_ANALYTICS"] = "1"
    out["GIT_AUTHOR_NAME"] = out["GIT_COMMITTER_NAME"] = "gpu-check"
    out["GIT_AUTHOR_EMAIL"] = out["GIT_COMMITTER_EMAIL"] = "gpu-check@example.invalid"
    return out


def _sh(repo: Path, env: dict[str, str], *cmd: str) -> None:
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PartError(f"{' '.join(cmd[-3:])} failed: {(proc.stderr or proc.stdout)[-500:]}")


def scratch_repo(repo: Path, device: str) -> dict[str, str]:
    """The pipeline's files (as ``tests/pipeline_repo.write_pipeline`` writes them: no
    .git needed) in ``repo`` with the toy params on ``device``; a git repo where git is
    installed, else ``dvc init --no-scm``. A repo made before (``--repo``) gets today's
    files again and keeps its DVC state: stages whose deps kept their bytes stay done."""
    made_before = (repo / ".dvc").is_dir()
    tests = _tests_module()
    for name in tests.PIPELINE_FILES:  # the copied folders go first: files deleted since too
        if (repo / name).is_dir():
            shutil.rmtree(repo / name)
    tests.write_pipeline(repo, toy_pipeline(device))
    env = stage_env(repo)
    if made_before:
        return env
    dvc = (sys.executable, "-m", "dvc")
    git = shutil.which("git") is not None
    if git:
        _sh(repo, env, "git", "init", "-q")
    _sh(repo, env, *dvc, "init", "-q", *([] if git else ["--no-scm"]))
    shutil.copy2(ROOT / ".dvcignore", repo / ".dvcignore")
    if git:
        _sh(repo, env, "git", "add", "-A")
        _sh(repo, env, "git", "commit", "-qm", "gpu-check")
    return env


def locked_stages(repo: Path) -> list[str]:
    """The stages ``dvc.lock`` holds: those an earlier invocation finished."""
    path = repo / "dvc.lock"
    return list(yaml.safe_load(path.read_text()).get("stages", {})) if path.is_file() else []


def _metrics(repo: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, trajectory in PIPELINE_METRICS.items():
        path = repo / "metrics/evaluate" / trajectory / f"{name}.json"
        if path.is_file():
            metrics = json.loads(path.read_text())
            found[name] = {k: metrics.get(k) for k in ("accuracy", "nll")}
    return found


def split(repo: Path, stages: dict[str, float]) -> dict[str, Any]:
    """Where each finished stage's seconds went (``stage_ledger.split``), and the totals."""
    per_stage = stage_ledger.split(repo, stages)
    rounded = {st: {k: round(v, 2) for k, v in found.items()} for st, found in per_stage.items()}
    totals = {k: round(v, 1) for k, v in stage_ledger.totals(per_stage).items()}
    return {"split_seconds": totals, "stage_split_seconds": rounded}


def repro(
    repo: Path, env: dict[str, str], ctx: Context, known: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``dvc repro``, its output read line by line: each ``Running stage`` line starts a
    stage's clock (and reports what is done so far, with ``known``, kept if the part is
    killed)."""
    started = time.monotonic()
    stages: dict[str, float] = {}
    tail: list[str] = []
    current: tuple[str, float] | None = None

    def close(now: float) -> None:
        if current is not None:
            stages[current[0]] = round(now - current[1], 1)

    proc = subprocess.Popen(
        [sys.executable, "-m", "dvc", "repro", *targets()],
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)  # the part's log
        tail = [*tail[-TAIL_LINES + 1 :], line.rstrip()]
        if line.startswith("Running stage '"):
            now = time.monotonic()
            close(now)
            current = (line.split("'")[1], now)
            ctx.report(
                {
                    **(known or {}),
                    "ok": False,
                    "running": current[0],
                    "stages_run": len(stages),
                    "stage_seconds": stages,
                    **split(repo, stages),
                    "seconds": round(now - started, 1),
                    "tail": tail[-10:],
                }
            )
    code = proc.wait()
    close(time.monotonic())
    out: dict[str, Any] = {
        "ok": code == 0,
        "dvc_seconds": round(time.monotonic() - started, 1),
        "stages_run": len(stages),
        "stage_seconds": stages,
        "slowest_stages": sorted(stages, key=stages.__getitem__, reverse=True)[:5],
        **split(repo, stages),
        "test": _metrics(repo),
    }
    if code != 0:
        out["exit_code"] = code
        out["error_tail"] = "\n".join(tail)[-3000:]
    return out


def pipeline(ctx: Context) -> dict[str, Any]:
    """The part: what is missing is one line; else the scratch repo and ``dvc repro``."""
    missing = [m for m in ("dvc", "mlflow") if importlib.util.find_spec(m) is None]
    if missing:
        raise PartError(
            f"{' and '.join(missing)} not installed for {sys.executable}: the pipeline "
            "part runs `dvc repro` (pip install them, or their wheels where offline)"
        )
    if ctx.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise PartError(NO_CUDA)
    kept = os.environ.get(KEPT_REPO)
    with contextlib.ExitStack() as stack:
        if kept:
            repo = Path(kept).resolve()
            repo.mkdir(parents=True, exist_ok=True)
        else:  # in the parent's temporary folder (beside the result file): removed by
            # the parent even when this process is killed at its time box
            tmp = tempfile.TemporaryDirectory(prefix="repo-", dir=ctx.result_path.parent)
            repo = Path(stack.enter_context(tmp))
        made = time.monotonic()
        env = scratch_repo(repo, ctx.device)
        what = "toy sizes (gpu_check_pipeline.toy_pipeline: the tests' small_params)"
        found = {"device": ctx.device, "params": what, "targets": targets() or "all"}
        if kept:
            found.update(repo=str(repo), stages_done_before=len(locked_stages(repo)))
        found["setup_seconds"] = round(time.monotonic() - made, 1)
        return {**found, **repro(repo, env, ctx, found)}
