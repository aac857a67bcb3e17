"""`make gpu-check` where there is no GPU: one line and exit 2; its measurements at toy
sizes on the CPU give the JSON a GPU run gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_it_says_so_in_one_line_and_exits_2() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("gpu-check: no CUDA device")


def test_every_measurement_runs_at_toy_sizes_on_the_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--skip-pipeline"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["device"] == "cpu" and out["quick"] is True
    for key in ("cpu_vs_device", "bf16_vs_fp32"):
        assert {"accuracy_difference_pp", "nll_relative_difference", "tolerance"} <= set(out[key])
    assert out["cpu_vs_device"]["accuracy_difference_pp"] == 0.0  # the CPU against itself
    rates = out["throughput"]["preresnet20"]["images_per_s"]
    assert rates["ours"] > 0 and rates["bare_pytorch"] > 0
    assert out["throughput"]["preresnet20"]["goal_ours_over_reference"] == 3.0
    assert out["evaluation"]["ours_over_bound"] > 0
