"""Where a pipeline run's time goes: a stage's fixed cost, and a forced run split up.

(a) Fixed cost of one stage: a stage whose work is trivial (it opens its
    MLflow run, logs a metric, writes its run file) run as a whole process,
    as DVC runs it, in rounds interleaved with two reference processes: an
    empty ``python -c pass`` and ``python -c "import torch"``. Median and
    range of the wall time per variant.
(b) A forced ``dvc repro`` of the default pipeline in a scratch copy of the
    project (default params, its own MLflow store): the total, and per stage
    its wall time from DVC's output and the split every stage records in
    ``runs/<stage>.json``: start-up (first line to work: imports, params),
    compute, finish (waiting for the tracking worker); the rest of a stage's
    wall time is DVC's own (hashing, caching, rewriting dvc.lock) and the
    interpreter's launch.
(c) Then, in the same workspace, the same forced run through ``scripts/repro.py
    --jobs N`` (what ``make run`` does: stages side by side, each through DVC),
    and its time as a ratio to (b)'s. (b)'s ledger orders its stages, as a
    previous run's does for a user.

Run ``python benchmarks/pipeline.py [--rounds N] [--skip-repro] [--jobs N]``; results
go to ``benchmarks/pipeline.json``. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # stage_ledger, shared with gpu-check

import stage_ledger  # noqa: E402
from timing import Outcome, Stopwatch, interleave, load_average, median_range, write_results  # noqa: E402

OUT = Path(__file__).resolve().parent / "pipeline.json"
BIN = Path(sys.executable).parent
TRIVIAL_STAGE = '''"""A stage whose work is trivial, tracked in MLflow (benchmarks/pipeline.py)."""

from _common import main, params, tracked


def run() -> None:
    p = params()
    with tracked("bench_trivial", p, {"benchmark": "fixed cost"}) as mlrun:
        mlrun.log_metrics({"work": 1.0})


if __name__ == "__main__":
    main(run)
'''


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    out["PATH"] = f"{BIN}{os.pathsep}{out.get('PATH', '')}"
    out["MLFLOW_DISABLE_TELEMETRY"] = "true"
    out["DVC_NO_ANALYTICS"] = "1"
    return out


def workspace(root: Path) -> Path:
    """A git + DVC repo holding the project's pipeline with the default params."""
    for name in ("dvc.yaml", "params.yaml", ".gitignore"):
        shutil.copy(ROOT / name, root)
    for folder in ("stages", "src", "networks"):  # networks: model.code
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    git = {"GIT_AUTHOR_NAME": "bench", "GIT_COMMITTER_NAME": "bench"}
    git |= {"GIT_AUTHOR_EMAIL": "bench@example.invalid", "GIT_COMMITTER_EMAIL": "b@e.invalid"}
    for cmd in (
        ["git", "init", "-q"],
        [str(BIN / "dvc"), "init", "-q"],
        [str(BIN / "dvc"), "config", "core.analytics", "false"],
        ["cp", str(ROOT / ".dvcignore"), "."],
        ["git", "add", "-A"],
        ["git", "commit", "-qm", "bench"],
    ):
        subprocess.run(cmd, cwd=root, env=env() | git, check=True, capture_output=True)
    return root


def timed(cmd: list[str], cwd: Path) -> Outcome:
    """The wall time of one whole process, start-up and exit included."""
    with Stopwatch() as watch:
        subprocess.run(cmd, cwd=cwd, env=env(), check=True, capture_output=True)
    return Outcome(watch.seconds)


def summary(seconds: list[float]) -> dict[str, Any]:
    """One variant's median and range, to the millisecond: process start-up is not finer."""
    median, low, high = median_range(seconds)
    return {
        "median_seconds": round(median, 3),
        "range_seconds": [round(low, 3), round(high, 3)],
        "rounds": len(seconds),
    }


def fixed_cost(root: Path, rounds: int) -> dict[str, Any]:
    """(a): the trivial stage beside the reference processes, rounds interleaved."""
    (root / "stages" / "bench_trivial.py").write_text(TRIVIAL_STAGE)
    python = str(BIN / "python")
    commands = {
        "trivial_tracked_stage": [python, "stages/bench_trivial.py"],
        "python_start": [python, "-c", "pass"],
        "import_torch": [python, "-c", "import torch"],
    }
    variants = {name: partial(timed, cmd, root) for name, cmd in commands.items()}
    variants["trivial_tracked_stage"]()  # warm-up: creates the store and experiment
    return {name: summary(t) for name, t in interleave(variants, rounds).items()}


def forced_repro(root: Path) -> dict[str, Any]:
    """(b): `dvc repro --force`, each stage's wall time from DVC's output, split."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(BIN / "dvc"), "repro", "--force"],
        cwd=root,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    marks: list[tuple[str, float]] = []
    for line in proc.stdout:
        found = re.match(r"Running stage '([^']+)'", line)
        if found:
            marks.append((found[1], time.perf_counter() - started))
    if proc.wait() != 0:
        raise SystemExit("dvc repro --force failed in the benchmark workspace")
    total = time.perf_counter() - started
    walls = {
        stage: (marks[i + 1][1] if i + 1 < len(marks) else total) - at
        for i, (stage, at) in enumerate(marks)
    }
    per_stage = stage_ledger.split(root, walls)
    zero = dict.fromkeys(stage_ledger.KEYS, 0.0)
    stages = [{"stage": st, "wall": walls[st], **zero, **found} for st, found in per_stage.items()]
    sums = stage_ledger.totals(per_stage)
    return {
        "total_seconds": round(total, 1),
        "stages": len(stages),
        "seconds": {k: round(v, 1) for k, v in sums.items()},
        "fixed_per_stage_seconds": round((total - sums["compute"]) / max(len(stages), 1), 2),
        "per_stage": [
            {k: round(v, 2) if isinstance(v, float) else v for k, v in s.items()} for s in stages
        ],
    }


def forced_side_by_side(root: Path, jobs: int, sequential: float) -> dict[str, Any]:
    """(c): ``scripts/repro.py --force --jobs N``, its total and ratio to (b)'s."""
    cmd = [str(BIN / "python"), str(ROOT / "scripts" / "repro.py"), "--force", "--jobs"]
    with Stopwatch() as watch:
        proc = subprocess.run([*cmd, str(jobs)], cwd=root, env=env(), capture_output=True)
    if proc.returncode != 0:
        raise SystemExit("scripts/repro.py --force failed in the benchmark workspace")
    sums = stage_ledger.totals(stage_ledger.by_stage(root))
    return {
        "jobs": jobs,
        "total_seconds": round(watch.seconds, 1),
        "ratio_to_dvc_repro": round(watch.seconds / sequential, 3),
        "seconds": {k: round(v, 1) for k, v in sums.items() if k != "dvc_and_launch"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds for the fixed cost")
    parser.add_argument("--skip-repro", action="store_true", help="only the fixed cost")
    parser.add_argument("--jobs", type=int, default=2, help="stages at once for (c)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bayesavg-bench-") as tmp:
        root = workspace(Path(tmp))
        results: dict[str, Any] = {"load_average_start": load_average()}
        results["fixed_cost"] = fixed_cost(root, args.rounds)
        if not args.skip_repro:
            results["forced_repro"] = forced_repro(root)
            sequential = results["forced_repro"]["total_seconds"]
            results["forced_side_by_side"] = forced_side_by_side(root, args.jobs, sequential)
        results["load_average_end"] = load_average()
    write_results(args.out, results)
    print("(a) fixed cost of one stage, whole process, median [range]:")
    for name, r in results["fixed_cost"].items():
        low, high = r["range_seconds"]
        print(f"  {name:<22} {r['median_seconds']:6.2f} s  [{low:.2f}, {high:.2f}]")
    if "forced_repro" in results:
        f = results["forced_repro"]
        s = f["seconds"]
        print(f"(b) dvc repro --force: {f['total_seconds']:.0f} s for {f['stages']} stages")
        print(
            f"  compute {s['compute']:.0f} s; start-up {s['startup']:.0f} s, tracking finish "
            f"{s['finish']:.0f} s, DVC and launch {s['dvc_and_launch']:.0f} s "
            f"(fixed cost {f['fixed_per_stage_seconds']:.2f} s per stage)"
        )
    if "forced_side_by_side" in results:
        c = results["forced_side_by_side"]
        print(
            f"(c) scripts/repro.py --force --jobs {c['jobs']}: {c['total_seconds']:.0f} s, "
            f"{c['ratio_to_dvc_repro']:.2f}x (b)'s time"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
