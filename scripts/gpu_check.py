"""`make gpu-check`: what only a CUDA GPU can show, part by part, into one JSON file.

Four invocations in ``make gpu-check``, each within its budget (default 480 s: 8 minutes
on one H100):

    python scripts/gpu_check.py --out gpu-check.json             # the in-process parts
    python scripts/gpu_check.py --pipeline --out gpu-check.json  # stages side by side, toy sizes
    python scripts/gpu_check.py --speed --out gpu-check.json \
        --parts step_variants,speed.preresnet20,speed.wideresnet28x10,throughput.resnet50
    python scripts/gpu_check.py --speed --out gpu-check.json --parts speed.preresnet164

(``--speed`` alone runs all six of its parts in one budget; PreResNet-164's cold
compilation takes minutes, hence its own invocation.)

Every part runs in a child process of its own with its own time box (``PARTS`` below,
cheapest first). After each, its result is written into ``--out`` (rewritten whole: it is
always valid JSON; parts already there from an earlier invocation are kept unless run
again) and printed as one JSON line. A part that raises records its error and traceback,
one killed at its box or dying (out of memory, a segfault) records why and whatever it
had reported so far (``partial``); the other parts still run. Children's output goes to
``--out`` with ``.log`` for a suffix. ``environment`` always runs first: without a CUDA
device the check stops there, says so in one line on stderr and exits 2. Exit code 1:
some part failed, timed out or was skipped. ``--device cpu --quick`` runs every part at
toy sizes on the CPU (to develop the script). See ``benchmarks/README.md`` (gpu-check).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import warnings
from importlib import metadata, util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:  # its helper modules, however this file is run
    sys.path.insert(0, str(ROOT / "scripts"))

from gpu_check_runner import JOBS, KEPT_REPO, NO_CUDA, TARGETS, Context, Part, child_main, run_parts  # noqa: E402

BUDGET_S = 480.0
TEST_PARTS = "GPU_CHECK_TEST_PARTS"  # tests only: a .py file whose PARTS replace these
PACKAGES = (
    "torch", "numpy", "torchvision", "pillow", "pyyaml", "dvc", "mlflow", "mlflow-skinny",
    "laplace-torch", "swa-gaussian",
)  # fmt: skip


def _numerics() -> dict[str, str] | str:
    """The CPU side as the stages compute (threads, pinned instruction set), or why not."""
    try:
        from bayesavg.runtime import numerics
    except ImportError as err:
        return f"bayesavg not importable: {err}"
    return numerics.describe()


def environment(ctx: Context) -> dict[str, Any]:
    """What ran where: Python, torch, CUDA, the GPU, its driver, the packages the other
    parts need (missing ones explain their errors); a one-kernel CUDA smoke test."""
    import torch

    packages: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    out: dict[str, Any] = {
        "requested_device": ctx.device,
        "quick": ctx.quick,
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "numerics": _numerics(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "packages": packages,
        "swag_importable": util.find_spec("swag") is not None,
    }
    with warnings.catch_warnings(record=True) as caught:  # why CUDA is not available
        warnings.simplefilter("always")
        out["cuda_available"] = torch.cuda.is_available()
    out["cuda_warnings"] = [str(w.message)[:500] for w in caught]
    smi = shutil.which("nvidia-smi")
    query = "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,compute_mode"
    try:
        proc = subprocess.run(
            [smi or "nvidia-smi", query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        out["nvidia_smi"] = (proc.stdout or proc.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as err:  # its absence is the finding
        out["nvidia_smi"] = f"{type(err).__name__}: {err}"
    if out["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        out.update(
            gpu=props.name,
            gpu_count=torch.cuda.device_count(),
            capability=f"{props.major}.{props.minor}",
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            bf16_supported=torch.cuda.is_bf16_supported(),
        )
        x = torch.randn(256, 256, device="cuda")
        out["cuda_smoke_ok"] = bool(torch.isfinite(x @ x).all().item())
    elif ctx.device.startswith("cuda"):
        out["error"] = NO_CUDA
    return out


def _throughput(model: str) -> Any:
    """The throughput part of ``model``, imported in the child only."""

    def run(ctx: Context) -> dict[str, Any]:
        from gpu_check_throughput import throughput

        return throughput(model, ctx)

    return run


def _lazy(module: str, name: str) -> Any:
    """``module.name`` imported in the child only: the parent imports no torch."""

    def run(ctx: Context) -> dict[str, Any]:
        return getattr(__import__(module), name)(ctx)

    return run


# Cheapest first, each with its time box in seconds. Estimated on one H100 (16 CPU
# cores; the assumptions and the table are in benchmarks/README.md, gpu-check), a
# child's start (Python, torch, CUDA) included: environment ~8 s, networks ~20 s (27
# small steps; not yet run on a GPU), bf16_vs_fp32 ~20 s,
# determinism ~25 s, cpu_vs_cuda ~30 s, evaluation ~35 s, throughput.preresnet20 ~35 s,
# throughput.wideresnet28x10 ~80 s: ~4.5 min. The boxes, ~2x that, sum to 515 s, over
# the 480 s budget less the parent's margin: they are scaled to it (run_parts), and a
# part is killed at its box, so the invocation ends within its budget whatever the
# estimates' error.
PARTS: tuple[Part, ...] = (
    Part("environment", 30, environment, "versions, GPU, driver, packages"),
    Part("networks", 45, _lazy("gpu_check_networks", "networks"), "27 networks, a step each"),
    Part("bf16_vs_fp32", 45, _lazy("gpu_check_parts", "bf16_vs_fp32"), "short run x2"),
    Part("determinism", 60, _lazy("gpu_check_determinism", "determinism"), "2 runs, bytes"),
    Part("cpu_vs_cuda", 60, _lazy("gpu_check_parts", "cpu_vs_cuda"), "short run on each"),
    Part("evaluation", 80, _lazy("gpu_check_evaluation", "evaluation"), "30-sample SWAG"),
    Part("throughput.preresnet20", 75, _throughput("preresnet20"), "images/s, 3 loops"),
    Part("throughput.wideresnet28x10", 120, _throughput("wideresnet28x10"), "images/s"),
)


def _speed(model: str) -> Any:
    """The speed part of ``model``, imported in the child only."""

    def run(ctx: Context) -> dict[str, Any]:
        from gpu_check_speed import speed

        return speed(model, ctx)

    return run


# The step variants (issue 27: eager, compiled, graph-captured, both), a third invocation:
# first that they train as eager does, then their speed. On the H200 PreResNet-164's part
# was cut at 90 s while compiling (a cold compilation on this machine's 2 cores: 146 s);
# a part killed at its box keeps the rounds it reported.
SPEED_PARTS: tuple[Part, ...] = (
    Part("environment", 30, environment, "versions, GPU, driver, packages"),
    Part("step_variants", 95, _lazy("gpu_check_variants", "step_variants"), "bytes vs eager"),
    Part("speed.preresnet20", 110, _speed("preresnet20"), "4 step variants"),
    Part("speed.wideresnet28x10", 140, _speed("wideresnet28x10"), "4 step variants"),
    Part("speed.preresnet164", 260, _speed("preresnet164"), "4 + reference, projection"),
    # issue 28: an ImageNet network at 224x224 (random resized crop + flip), ours / bare
    Part("throughput.resnet50", 100, _throughput("resnet50"), "images/s, 2 loops"),
)
PIPELINE_PARTS: tuple[Part, ...] = (
    Part("pipeline", 470, _lazy("gpu_check_pipeline", "pipeline"), "dvc repro, toy sizes"),
)


def part_table(pipeline: bool, speed: bool = False) -> tuple[Part, ...]:
    """The parts of one invocation (tests: those of the file named by ``$GPU_CHECK_TEST_PARTS``)."""
    fake = os.environ.get(TEST_PARTS)
    if fake:
        import importlib.util

        spec = importlib.util.spec_from_file_location("gpu_check_test_parts", fake)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return tuple(module.PARTS)
    return PIPELINE_PARTS if pipeline else SPEED_PARTS if speed else PARTS


def _table_help() -> str:
    every = (*PARTS, *SPEED_PARTS[1:], *PIPELINE_PARTS)
    rows = [f"  {p.name:<28} {p.box_s:>4.0f} s  {p.what}" for p in every]
    return "parts, in order, with their time boxes:\n" + "\n".join(rows)


def _setup(device: str, quick: bool) -> None:
    """A child's set-up, as a stage's: pinned CPU numerics (thread count, instruction
    set) before torch is imported, and deterministic cuBLAS's workspace (it must be set
    before the first cuBLAS call; ``seeding.seed_everything`` asks for it on CUDA)."""
    if quick and device == "cpu":
        # A smoke run, often beside other jobs: one thread each avoids the OpenMP threads
        # waiting on each other, which can slow a busy machine's run down tenfold.
        os.environ.setdefault("BAYESAVG_THREADS", "1")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        from bayesavg.runtime import numerics
    except ImportError as err:  # environment still reports; the other parts fail on it
        print(f"gpu-check: bayesavg not importable, numerics not pinned: {err}", flush=True)
        return
    numerics.pin()


def _child(args: argparse.Namespace, table: tuple[Part, ...]) -> None:
    """``--run-part``: the one part, in this process (never returns)."""
    part = next(p for p in table if p.name == args.run_part)
    ctx = Context(args.device, args.quick, args.deadline, Path(args.result), Path(args.out))
    child_main(part, ctx, lambda: _setup(args.device, args.quick))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=_table_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--quick", action="store_true", help="toy sizes (a smoke run)")
    parser.add_argument("--out", default="gpu-check.json", help="the JSON file (merged into)")
    parser.add_argument("--pipeline", action="store_true", help="the dvc repro part alone")
    parser.add_argument("--speed", action="store_true", help="the step variants' parts")
    parser.add_argument("--parts", help="comma-separated names (environment always runs)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds, all parts")
    parser.add_argument(
        "--targets",
        help="with --pipeline: the stages to reproduce (space-separated; with what they "
        "need), e.g. those a run cut short did not reach; default: every stage",
    )
    parser.add_argument(
        "--repo",
        help="with --pipeline: the scratch repo's folder, kept (default: a temporary one); "
        "run again with the same --repo, it goes on where a run cut short stopped",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        help="with --pipeline: stages side by side (default: the usable cores, at most 8; "
        "1 where the GPU's compute mode is exclusive)",
    )
    for hidden in ("--run-part", "--result"):  # a child's own arguments
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # SIGTERM (a time limit around this script) as an exception: the running part's
    # process group is killed on the way out (gpu_check_runner._wait)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.speed and args.pipeline:
        parser.error("--speed and --pipeline are separate invocations")
    if args.targets is not None and not args.pipeline:
        parser.error("--targets is for --pipeline")
    if args.repo is not None and not args.pipeline:
        parser.error("--repo is for --pipeline")
    if args.jobs is not None and not args.pipeline:
        parser.error("--jobs is for --pipeline")
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.jobs is not None:
        os.environ[JOBS] = str(args.jobs)
    if args.targets is not None:
        os.environ[TARGETS] = args.targets  # the pipeline part's child reads it
    if args.repo is not None:
        os.environ[KEPT_REPO] = str(Path(args.repo).resolve())
    table = part_table(args.pipeline, args.speed)
    if args.run_part:
        _child(args, table)
    parts = list(table)
    if args.parts:
        wanted = set(args.parts.split(","))
        unknown = wanted - {p.name for p in table}
        if unknown:
            parser.error(f"unknown parts {sorted(unknown)}; known: {[p.name for p in table]}")
        parts = [p for p in table if p.name in wanted or p.name == "environment"]
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    argv_child = [sys.executable, str(Path(__file__).resolve()), "--device", args.device]
    argv_child += (
        ["--quick"] * args.quick + ["--pipeline"] * args.pipeline + ["--speed"] * args.speed
    )
    invocation = {
        "argv": sys.argv[1:] if argv is None else argv,
        "budget_s": args.budget,
        "boxes_s": {p.name: p.box_s for p in parts},
    }

    def stop(name: str, result: dict[str, Any]) -> str | None:
        return "no CUDA device" if result.get("error") == NO_CUDA else None

    started = time.monotonic()
    results = run_parts(parts, argv_child, out, args.budget, invocation, stop)
    print(f"gpu-check: {out} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    if any(r.get("error") == NO_CUDA for r in results.values()):
        print(NO_CUDA, file=sys.stderr)
        return 2
    failed = [n for n, r in results.items() if {"error", "skipped"} & set(r)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
