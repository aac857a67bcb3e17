"""`make gpu-check` (scripts/gpu_check.py): without a GPU it says so in one line and exits
2; at toy sizes on the CPU every measurement runs and gives the JSON a GPU run gives."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
NO_CUDA = (
    "gpu-check: no CUDA device (torch.cuda.is_available() is False); "
    "run it on a machine with an NVIDIA GPU\n"
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_it_says_so_in_one_line_and_exits_2() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == NO_CUDA


@pytest.fixture(scope="module")
def quick() -> dict[str, Any]:
    """One smoke run on the CPU (about 5 s), shared by the checks below."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--skip-pipeline"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_quick_run_has_every_measurement_labelled_cpu(quick: dict[str, Any]) -> None:
    assert quick["device"] == "cpu" and quick["quick"] is True
    assert quick["torch"] == torch.__version__ and quick["timestamp"].endswith("Z")
    measured = {"cpu_vs_cuda", "bf16_vs_fp32", "throughput", "evaluation", "peak_memory_mib"}
    assert measured <= set(quick)
    assert not {"pipeline", "determinism"} & set(quick)  # --skip-pipeline
    for key in ("cpu_vs_cuda", "bf16_vs_fp32", "evaluation"):
        assert "error" not in quick[key], quick[key]["error"]


@pytest.mark.parametrize("key", ["cpu_vs_cuda", "bf16_vs_fp32"])
def test_comparisons_state_their_tolerance(quick: dict[str, Any], key: str) -> None:
    found = quick[key]
    assert found["tolerance"]["accuracy_pp"] == 1.0 and found["tolerance"]["nll_relative"] > 0
    assert set(found["differences"]) == {"map", "swag"}
    for run in found["runs"].values():
        for method in ("map", "swag"):
            assert 0.0 <= run[method]["accuracy"] <= 1.0 and run[method]["nll"] > 0
    assert isinstance(found["within_tolerance"], bool)


def test_cpu_against_itself_is_the_same_run(quick: dict[str, Any]) -> None:
    found = quick["cpu_vs_cuda"]
    assert found["weights_relative_difference"] == 0.0
    assert all(
        d == {"accuracy_pp": 0.0, "nll_relative": 0.0} for d in found["differences"].values()
    )
    assert [r["precision"] for r in quick["bf16_vs_fp32"]["runs"].values()] == ["fp32", "bf16"]


def test_throughput_of_ours_and_the_bare_loop(quick: dict[str, Any]) -> None:
    found = quick["throughput"]["preresnet20"]
    assert "error" not in found, found.get("error")
    rates = found["images_per_s"]
    assert rates["ours"] > 0 and rates["bare_pytorch"] > 0
    assert found["ours_over_bare"] > 0
    assert found["goal_ours_over_bare"] == 0.95 and found["goal_ours_over_reference"] == 3.0


def test_throughput_of_the_reference_code_where_installed(quick: dict[str, Any]) -> None:
    found = quick["throughput"]["preresnet20"]
    if importlib.util.find_spec("swag") is None:
        assert "reference_swag_code" in found["skipped"]
        pytest.skip("swa-gaussian is not installed (make bench-install)")
    assert found["images_per_s"]["reference_swag_code"] > 0
    assert found["ours_over_reference"] > 0
    assert found["precision"]["reference_swag_code"] == "fp32"


def test_evaluation_against_the_forward_passes(quick: dict[str, Any]) -> None:
    found = quick["evaluation"]
    assert found["ours_seconds"] > 0 and found["bound_seconds"] > 0
    assert found["ours_over_bound"] > 0 and found["goal_ours_over_bound"] == 1.10


def test_peak_memory_lists_every_measurement_and_is_null_on_the_cpu(quick: dict[str, Any]) -> None:
    peaks = quick["peak_memory_mib"]
    assert {"evaluation.ours", "throughput.preresnet20.ours", "bf16_vs_fp32.runs.bf16"} <= set(
        peaks
    )
    assert all(v is None for v in peaks.values())


def test_toy_pipeline_params_are_valid() -> None:
    """``--quick`` without ``--skip-pipeline`` reproduces the pipeline on these params."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_check_parts import toy_pipeline

    from bayesavg.config import parse_params

    raw = toy_pipeline(dict(yaml.safe_load((ROOT / "params.yaml").read_text()), device="cpu"))
    p = parse_params(raw)
    assert p.device == "cpu" and p.model.name == "mlp"
