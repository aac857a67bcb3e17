"""How two of gpu-check's short runs compare (CPU vs CUDA, bf16 vs fp32): test metrics
against the spread of seeds measured on the CPU, and the weights' distance. No torch
import of its own: the runs carry their weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PREDICTORS = {"map": None, "swag": 0.5}  # method: SWAG scale (the params' defaults)
# Two runs on other kernels (CPU vs CUDA) or precisions (bf16 vs fp32) start alike and
# drift apart over thousands of steps as runs of two seeds do: their weights differ (the
# relative difference says by how much), their test metrics must differ no more than two
# seeds' do. How much that is, per predictor, was measured on the CPU over 12 seeds of the
# full-size short run (scripts/gpu_check_seeds.py): the 95th percentile of the pairwise
# differences. A size it was not measured for (--quick) has no tolerance.
SEED_SPREAD = ROOT / "benchmarks" / "gpu" / "seed_spread.json"


def without_theta(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if k != "theta"}


def tolerance(what: str) -> dict[str, Any] | None:
    """The seed spread measured for the run ``what`` describes (``SEED_SPREAD``), or None."""
    if not SEED_SPREAD.is_file():
        return None
    found = json.loads(SEED_SPREAD.read_text())
    return found if found["what"] == what else None


def compare(
    a: dict[str, Any], b: dict[str, Any], names: tuple[str, str], what: str
) -> dict[str, Any]:
    """Metric differences of two short runs against the seed spread; weights' distance."""
    diffs = {}
    for method in PREDICTORS:
        acc = 100 * abs(a[method]["accuracy"] - b[method]["accuracy"])
        nll = abs(a[method]["nll"] - b[method]["nll"]) / a[method]["nll"]
        diffs[method] = {"accuracy_pp": round(acc, 3), "nll_relative": round(nll, 4)}
    spread = tolerance(what)
    if spread is None:
        limits: dict[str, Any] | str = f"none: no seed spread for this size in {SEED_SPREAD.name}"
        ok = None
    else:
        limits = {
            m: {k: spread["tolerance"][m][k] for k in ("accuracy_pp", "nll_relative")}
            for m in PREDICTORS
        }
        limits["measured_as"] = (
            f"the {spread['quantile']:.0%} quantile of the differences between "
            f"{len(spread['runs'])} CPU seeds ({SEED_SPREAD.relative_to(ROOT)})"
        )
        ok = all(diffs[m][k] <= limits[m][k] for m in PREDICTORS for k in diffs[m])
    weights = float((a["theta"] - b["theta"]).norm() / a["theta"].norm())
    runs = {n: without_theta(r) for n, r in zip(names, (a, b), strict=True)}
    return {
        "runs": runs,
        "differences": diffs,
        "weights_relative_difference": weights,
        "tolerance": limits,
        "relative_to": names[0],
        "within_tolerance": ok,
    }
