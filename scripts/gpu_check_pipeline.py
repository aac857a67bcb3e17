"""The ``pipeline`` part of ``scripts/gpu_check.py --pipeline``: the default pipeline at
toy sizes through ``dvc repro`` with ``device: cuda``, in a scratch repo.

Its own invocation (and its own time box): every stage is a process of its own that
imports torch and MLflow and starts CUDA, so the whole pipeline costs minutes even at
toy sizes, and a failing stage must not cost the in-process measurements. The stages
run side by side (``scripts/repro.py --jobs``, each through ``dvc repro
--single-item``): one at a time they would take about 7.5 minutes on an H100 (33 ran
in 323 s there before two calls ran out of time); 8 side by side, all 44 took 144 s on
an H200.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import stage_ledger
import yaml
from gpu_check_runner import JOBS, KEPT_REPO, NO_CUDA, TARGETS, Context, PartError

ROOT = Path(__file__).resolve().parents[1]
PIPELINE_METRICS = {"map": "sgd", "swa": "swag", "swag": "swag"}  # predictor: its trajectory
TAIL_LINES = 40
MAX_LANES = 8  # stages side by side: past the longest chain's share, more buy nothing


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


# scripts/repro.py's lines: "<stage> | <DVC's line>", and its own line when one ends
STAGE_LINE = re.compile(r"^(\S+)\s+\| (.*)$")
ENDED = re.compile(r"^(finished|failed \(exit code -?\d+\)) in ([\d.]+) s \(\d+ of \d+\)$")


def exclusive_gpu() -> bool:
    """Whether ``nvidia-smi`` says the GPU takes one process at a time (compute mode
    ``Exclusive_Process``), where stages side by side would fail to start CUDA."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    query = [smi, "--query-gpu=compute_mode", "--format=csv,noheader"]
    try:
        found = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "exclusive" in found.lower()


def lanes(device: str) -> tuple[int, str]:
    """How many stages run side by side, and why: ``--jobs`` where given; one on a GPU
    in exclusive compute mode; else the usable cores, at most ``MAX_LANES``. At toy
    sizes a stage is mostly start-up on the CPU (Python, torch, CUDA, MLflow: 8 to 17 s
    each on the H100, 523 s for all 44 one at a time) and uses a few hundred MiB of
    the GPU, so lanes cut the part to about its longest chain of stages."""
    given = os.environ.get(JOBS)
    if given:
        return int(given), "--jobs"
    if device.startswith("cuda") and exclusive_gpu():
        return 1, "the GPU's compute mode is exclusive: one process at a time"
    from bayesavg.runtime import numerics

    return min(MAX_LANES, numerics.usable_cores()), f"usable cores, at most {MAX_LANES}"


def repro(
    repo: Path,
    env: dict[str, str],
    ctx: Context,
    known: dict[str, Any] | None = None,
    jobs: int = 1,
) -> dict[str, Any]:
    """``scripts/repro.py --jobs``, which runs each stage through ``dvc repro
    --single-item``, its output read line by line: a stage's ``Running stage`` line and
    its end report what is done so far (with ``known``, kept if the part is killed);
    a stage's seconds are those repro.py gives (its ``dvc repro``, start to end)."""
    started = time.monotonic()
    stages: dict[str, float] = {}
    failed: dict[str, str] = {}
    running: list[str] = []
    tail: list[str] = []

    def progress() -> None:
        ctx.report(
            {
                **(known or {}),
                "ok": False,
                "running": list(running),
                "stages_run": len(stages),
                "stage_seconds": stages,
                **split(repo, stages),
                "seconds": round(time.monotonic() - started, 1),
                "tail": tail[-10:],
            }
        )

    command = [sys.executable, str(ROOT / "scripts/repro.py"), "--jobs", str(jobs), *targets()]
    proc = subprocess.Popen(
        command,
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    with proc:  # closes its output pipe and waits
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)  # the part's log
            tail = [*tail[-TAIL_LINES + 1 :], line.rstrip()]
            found = STAGE_LINE.match(line.rstrip())
            if found is None:
                continue
            stage, text = found.groups()
            ended = ENDED.match(text)
            if text.startswith("Running stage '"):
                running.append(stage)
            elif ended is None:
                continue
            elif ended.group(1) != "finished":
                failed[stage] = ended.group(1)
            elif stage in running:  # not so a stage DVC found up to date: it ran nothing
                stages[stage] = float(ended.group(2))
            if ended is not None and stage in running:
                running.remove(stage)
            progress()
    code = proc.returncode
    out: dict[str, Any] = {
        "ok": code == 0,
        "jobs": jobs,
        "dvc_seconds": round(time.monotonic() - started, 1),
        "stages_run": len(stages),
        "stage_seconds": stages,
        "stage_seconds_sum": round(sum(stages.values()), 1),
        "slowest_stages": sorted(stages, key=stages.__getitem__, reverse=True)[:5],
        **split(repo, stages),
        "test": _metrics(repo),
    }
    if code != 0:
        out.update(exit_code=code, failed_stages=failed, error_tail="\n".join(tail)[-3000:])
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
        jobs, why = lanes(ctx.device)
        found = {"device": ctx.device, "params": what, "targets": targets() or "all"}
        found.update(jobs=jobs, jobs_why=why)
        if kept:
            found.update(repo=str(repo), stages_done_before=len(locked_stages(repo)))
        found["setup_seconds"] = round(time.monotonic() - made, 1)
        return {**found, **repro(repo, env, ctx, found, jobs)}
