"""`make gpu-check`: what only a CUDA GPU can show, as one JSON object on stdout.

- ``pipeline``: the default pipeline end to end with ``device: cuda`` (``dvc repro`` in a
  scratch git + DVC repo holding this checkout's tracked files, its own MLflow store):
  wall seconds, stages run, test accuracy and NLL of map, swa and swag;
- ``determinism``: pretrain and finetune@swag forced again on the GPU: the posterior
  files' sha256 of both runs, which must be equal (CUDA: deterministic kernels);
- ``cpu_vs_cuda``, ``bf16_vs_fp32``: the same short in-process pretrain + SWAG run on
  mnist5k on both devices, and in both precisions on the GPU: test metrics of the map
  (end point) and swag predictors, their differences against a stated tolerance;
- ``throughput``: images/s of SWAG fine-tuning (PreResNet-20, WideResNet-28x10, CIFAR-
  shaped uint8 batches of 128, crop + flip) for ours, a bare PyTorch loop with the
  same precision, layout and augmentation ops, and the SWAG reference code's own loop;
- ``evaluation``: a 30-sample SWAG evaluation (BN recomputed per sample) against S x
  (BN pass + test forward) written out by hand;
- ``peak_memory_mib``: ``torch.cuda.max_memory_allocated`` of each measurement.

Without a CUDA device it says so in one line and exits 2. ``--device cpu --quick`` runs
every measurement at toy sizes on the CPU (to develop and test the script; the JSON then
says ``"device": "cpu"`` and compares the CPU with itself). ``--skip-pipeline`` leaves out
the two ``dvc repro`` runs. See ``benchmarks/README.md`` (gpu-check).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:  # its helper modules, however this file is run
    sys.path.insert(0, str(ROOT / "scripts"))
BIN = Path(sys.executable).parent
NO_CUDA = (
    "gpu-check: no CUDA device (torch.cuda.is_available() is False); "
    "run it on a machine with an NVIDIA GPU"
)
PIPELINE_METRICS = {"map": "sgd", "swa": "swag", "swag": "swag"}  # predictor: its trajectory
RERUN = ("pretrain", "finetune@swag")
RERUN_FILES = ("models/pretrain/posterior.pt", "models/swag/posterior.pt")


def _env(repo: Path) -> dict[str, str]:
    """The stages' environment: the venv first on PATH, MLflow in the scratch repo,
    no inherited MLflow or DVC settings, telemetry off, a git identity."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    out["PATH"] = f"{BIN}{os.pathsep}{out.get('PATH', '')}"
    out["MLFLOW_TRACKING_URI"] = f"sqlite:///{repo / 'mlflow.db'}"
    out["MLFLOW_DISABLE_TELEMETRY"] = "true"
    out["DVC_NO_ANALYTICS"] = "1"
    out["GIT_AUTHOR_NAME"] = out["GIT_COMMITTER_NAME"] = "gpu-check"
    out["GIT_AUTHOR_EMAIL"] = out["GIT_COMMITTER_EMAIL"] = "gpu-check@example.invalid"
    return out


def scratch_repo(repo: Path, device: str, quick: bool) -> Path:
    """This checkout's tracked files (as they are on disk) in a fresh git repo, with
    ``device`` in params.yaml; ``quick``: toy sizes (``gpu_check_parts.toy_pipeline``)."""
    import yaml

    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["device"] = device
    if quick:
        from gpu_check_parts import toy_pipeline

        params = toy_pipeline(params)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "gpu-check"]):
        subprocess.run(cmd, cwd=repo, env=_env(repo), check=True, capture_output=True)
    return repo


def _dvc(repo: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.perf_counter()
    proc = subprocess.run(
        [str(BIN / "dvc"), *args], cwd=repo, env=_env(repo), capture_output=True, text=True
    )
    return proc, round(time.perf_counter() - started, 1)


def _sha256(path: Path) -> str | None:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def pipeline(repo: Path) -> dict[str, Any]:
    """``dvc repro`` of the whole pipeline: does it run end to end on the device, how long."""
    proc, seconds = _dvc(repo, "repro")
    out: dict[str, Any] = {
        "ok": proc.returncode == 0,
        "seconds": seconds,
        "stages_run": proc.stdout.count("Running stage"),
    }
    if proc.returncode != 0:
        out["error_tail"] = (proc.stderr or proc.stdout)[-1500:]
        return out
    out["test"] = {}
    for name, trajectory in PIPELINE_METRICS.items():
        metrics = json.loads((repo / "metrics/evaluate" / trajectory / f"{name}.json").read_text())
        out["test"][name] = {k: metrics[k] for k in ("accuracy", "nll")}
    return out


def determinism(repo: Path) -> dict[str, Any]:
    """pretrain and finetune@swag forced a second time: bitwise the first run's files?"""
    first = {f: _sha256(repo / f) for f in RERUN_FILES}
    proc, seconds = _dvc(repo, "repro", "--force", "--single-item", *RERUN)
    second = {f: _sha256(repo / f) for f in RERUN_FILES}
    out: dict[str, Any] = {
        "stages": list(RERUN),
        "rerun_ok": proc.returncode == 0,
        "rerun_seconds": seconds,
        "sha256": {f: [first[f], second[f]] for f in RERUN_FILES},
        "bitwise_equal": proc.returncode == 0 and None not in first.values() and first == second,
    }
    if proc.returncode != 0:
        out["error_tail"] = (proc.stderr or proc.stdout)[-1500:]
    return out


def guarded(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``fn(*args)``, or the error it raised: one failing measurement (a kernel without a
    deterministic implementation, out of memory) must not cost the others' numbers."""
    try:
        return fn(*args)
    except Exception as err:  # reported in the JSON, the traceback on stderr
        traceback.print_exc()
        return {"error": f"{type(err).__name__}: {err}"[:2000]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--quick", action="store_true", help="toy sizes (a smoke run)")
    parser.add_argument("--skip-pipeline", action="store_true", help="no dvc repro runs")
    args = parser.parse_args(argv)
    # Deterministic cuBLAS (as the stages ask for, seeding.seed_everything) needs this set
    # before the first cuBLAS call of the process.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if args.quick and device.type == "cpu":
        # A smoke run, often beside other jobs: one thread each avoids the OpenMP threads
        # waiting on each other, which can slow a busy machine's run down tenfold.
        torch.set_num_threads(1)
    started = time.perf_counter()
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "python": platform.python_version(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": args.quick,
        "cpu_threads": torch.get_num_threads(),
    }
    if not args.skip_pipeline:  # first: its stages have the GPU to themselves
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            repo = Path(tmp)
            made = guarded(lambda: {"repo": str(scratch_repo(repo, str(device), args.quick))})
            out["pipeline"] = made if "error" in made else guarded(pipeline, repo)
            ran = out["pipeline"].get("ok", False)
            out["determinism"] = (
                guarded(determinism, repo) if ran else {"skipped": "the pipeline failed"}
            )
    import gpu_check_parts as parts
    from gpu_check_throughput import throughput

    size = parts.Size.quick() if args.quick else parts.Size.full()
    out["cpu_vs_cuda"] = guarded(parts.cpu_vs_cuda, device, size)
    out["bf16_vs_fp32"] = guarded(parts.bf16_vs_fp32, device, size)
    out["throughput"] = {
        name: guarded(throughput, name, device, size) for name in size.throughput_models
    }
    out["evaluation"] = guarded(parts.evaluation, device, size)
    out["peak_memory_mib"] = parts.peak_memory(out)
    out["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
