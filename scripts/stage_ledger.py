"""Where each stage of a ``dvc repro`` spent its wall time, read from the ledger its
MLflow runs leave in ``runs/*.json`` (``stages/_common.py`` writes one per run, tagged
with its DVC stage): ``startup`` (the process's first line, or the previous run's end, to
the run's work: imports, torch and CUDA included), ``compute``, ``finish`` (waiting for
the tracking worker), and the rest of the stage's wall time, ``dvc_and_launch`` (the
interpreter's start, DVC's own work). Shared by ``benchmarks/pipeline.py``, the
pipeline part of ``scripts/gpu_check.py`` and ``scripts/repro.py`` (which orders stages
by it); imports nothing of the project."""

from __future__ import annotations

import json
from pathlib import Path

KEYS = ("startup", "compute", "finish", "dvc_and_launch")


def by_stage(root: Path) -> dict[str, dict[str, float]]:
    """Per DVC stage, the ledger's seconds of its runs summed by key (a stage of several
    runs, such as evaluate@<trajectory>, has one entry per run). An entry being written
    is skipped."""
    sums: dict[str, dict[str, float]] = {}
    for path in sorted((root / "runs").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        into = sums.setdefault(record.get("dvc_stage", record.get("stage")), {})
        for key, value in record.get("seconds", {}).items():
            into[key] = into.get(key, 0.0) + value
    return sums


def split(root: Path, walls: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per stage of ``walls`` (stage -> wall seconds, in order): ``by_stage``'s seconds
    and ``dvc_and_launch``, the remainder. A stage with none (it failed, or keeps no
    run) is all ``dvc_and_launch``."""
    sums = by_stage(root)
    out = {}
    for stage, wall in walls.items():
        found = dict(sums.get(stage, {}))
        found["dvc_and_launch"] = wall - sum(found.values())
        out[stage] = found
    return out


def totals(per_stage: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each of ``KEYS`` summed over the stages."""
    return {k: sum(s.get(k, 0.0) for s in per_stage.values()) for k in KEYS}
