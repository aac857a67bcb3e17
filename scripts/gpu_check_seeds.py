"""How far two seeds of gpu-check's short run land apart on the CPU: the tolerance its
``cpu_vs_cuda`` and ``bf16_vs_fp32`` parts compare against.

Why: runs on other kernels (CUDA against the CPU) or in another precision start alike
and drift apart over thousands of steps, as runs of two seeds do. Their test metrics
should then differ no more than two seeds' do, and how much that is is measured here,
not guessed: the short run (``gpu_check_parts.short_run``, full size) for seeds
0..N-1 on the CPU, whose bytes are the same on every x86-64 CPU with AVX2 (so this file
is machine-independent), and for each predictor and metric the 95th percentile of
|a - b| over the ordered pairs of seeds (NLL relative to the first of the pair, as the
parts measure it). Usage: ``python scripts/gpu_check_seeds.py [--seeds 12]`` writes
``benchmarks/gpu/seed_spread.json`` (about 10 s a seed on two cores).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "gpu" / "seed_spread.json"
QUANTILE = 0.95


def quantile(values: list[float], q: float) -> float:
    """The linear-interpolation quantile (numpy's default), without numpy."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low, high = math.floor(at), math.ceil(at)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def spread(runs: dict[int, dict[str, Any]], methods: list[str]) -> dict[str, Any]:
    """Per method: the ``QUANTILE`` of the pairwise accuracy (pp) and relative NLL
    differences of ``runs`` (seed -> short-run result), and their largest."""
    out: dict[str, Any] = {}
    for method in methods:
        acc, nll = [], []
        for a, b in itertools.permutations(runs.values(), 2):
            acc.append(100 * abs(a[method]["accuracy"] - b[method]["accuracy"]))
            nll.append(abs(a[method]["nll"] - b[method]["nll"]) / a[method]["nll"])
        out[method] = {
            "accuracy_pp": round(quantile(acc, QUANTILE), 3),
            "nll_relative": round(quantile(nll, QUANTILE), 4),
            "largest": {"accuracy_pp": round(max(acc), 3), "nll_relative": round(max(nll), 4)},
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=12, help="seeds 0..N-1 (at least 2)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error("--seeds: at least 2")
    sys.path.insert(0, str(ROOT / "scripts"))
    from bayesavg.runtime import numerics

    numerics.pin()  # before torch: the CPU bytes every machine reproduces
    import gpu_check_parts as parts
    from gpu_check_compare import PREDICTORS

    size = parts.Size.full()
    runs: dict[int, dict[str, Any]] = {}
    for seed in range(args.seeds):
        run = parts.short_run("cpu", "fp32", size, seed=seed)
        runs[seed] = {m: run[m] for m in PREDICTORS}
        print(f"seed {seed}: {json.dumps(runs[seed])}", file=sys.stderr, flush=True)
    found = {
        "what": parts.what(size),
        "device": "cpu",
        "precision": "fp32",
        "quantile": QUANTILE,
        "tolerance": spread(runs, list(PREDICTORS)),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=1) + "\n")
    print(f"{args.out}: {args.seeds} seeds", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
