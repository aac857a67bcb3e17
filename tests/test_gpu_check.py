"""`make gpu-check` (scripts/gpu_check.py) always reports: each part in a child process
of its own, within its time box, its result in the --out file as soon as it is known.

Misbehaving parts (tests/gpu_check_fake_parts.py, run in place of the real ones through
``$GPU_CHECK_TEST_PARTS``) prove the robustness; the real parts run at toy sizes on the
CPU (one cheap part here, all of them in the slow test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
FAKE = ROOT / "tests" / "gpu_check_fake_parts.py"
NO_CUDA = (
    "gpu-check: no CUDA device (torch.cuda.is_available() is False); "
    "run it on a machine with an NVIDIA GPU"
)
sys.path.insert(0, str(ROOT / "scripts"))


def gpu_check(
    out: Path, *args: str, fake: bool = False, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], dict[str, Any]]:
    """The script's exit, its stdout's JSON lines, and the --out file."""
    env = {k: v for k, v in os.environ.items() if k != "GPU_CHECK_TEST_PARTS"}
    if fake:
        env["GPU_CHECK_TEST_PARTS"] = str(FAKE)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return proc, lines, json.loads(out.read_text()) if out.exists() else {}


def _gone(pid: int) -> bool:
    """No such process, or a zombie (killed, not yet reaped by init)."""
    time.sleep(0.2)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of the misbehaving parts (about 4 s: the hanging one has a 2 s box)."""
    out = tmp_path_factory.mktemp("fake") / "check.json"
    parts = "works,raises,hangs,killed,exits,explains,last"
    started = time.monotonic()
    proc, lines, saved = gpu_check(out, "--device", "cpu", "--parts", parts, fake=True)
    return {
        "proc": proc,
        "lines": lines,
        "saved": saved,
        "seconds": time.monotonic() - started,
        "log": out.with_suffix(".log"),
    }


def test_parts_run_in_order_each_printed_and_saved_as_it_ends(fake: dict[str, Any]) -> None:
    order = ["works", "raises", "hangs", "killed", "exits", "explains", "last"]
    assert [next(iter(line)) for line in fake["lines"]] == order
    assert [k for k in fake["saved"] if k in order] == order
    # each part saw, in the --out file, every part before it (rewritten whole each time)
    saved = {name: fake["saved"][name] for name in order}
    seen = {name: r.get("seen", r.get("partial", {}).get("seen")) for name, r in saved.items()}
    assert seen["works"] == [] and seen["raises"] == ["works"]
    assert seen["hangs"] == ["works", "raises"] and seen["killed"] == order[:3]
    assert seen["last"] == order[:6]
    for line in fake["lines"]:  # what was printed is what was saved
        ((name, result),) = line.items()
        assert fake["saved"][name] == json.loads(json.dumps(result))


def test_a_part_that_raises_records_its_error_and_traceback(fake: dict[str, Any]) -> None:
    found = fake["saved"]["raises"]
    assert found["error"] == "ValueError: a measurement failed"
    assert "Traceback" in found["traceback"] and "def raises" not in found["traceback"]
    assert "in raises" in found["traceback"]
    assert found["partial"] == {"seen": ["works"], "measured": 1}
    assert found["exit_code"] == 1 and found["seconds"] >= 0


def test_a_hanging_part_is_killed_at_its_box_with_its_partial_result(
    fake: dict[str, Any],
) -> None:
    found = fake["saved"]["hangs"]
    assert found["error"] == "timed out after 2 s (its time box)"
    assert found["partial"]["rounds_done"] == 1
    assert 2 <= found["seconds"] < 10 and found["exit_code"] == -9
    assert _gone(found["partial"]["grandchild"])  # its process group went with it


def test_a_part_whose_process_dies_is_recorded_and_the_rest_run(fake: dict[str, Any]) -> None:
    killed = fake["saved"]["killed"]
    assert killed["error"].startswith("the process died of signal 9 (SIGKILL)")
    assert killed["partial"] == {"seen": ["works", "raises", "hangs"], "before_the_kill": True}
    exits = fake["saved"]["exits"]
    assert exits["error"] == "the process exited with code 137 without a result"
    assert "log_tail" in exits and "partial" not in exits
    assert fake["saved"]["last"]["seen"][-1] == "explains"


def test_a_part_whose_parent_is_gone_ends_itself_after_its_deadline(tmp_path: Path) -> None:
    """The child run directly, as if its parent had been killed outright: a watchdog
    kills its process group 2 s after its deadline."""
    env = dict(os.environ, GPU_CHECK_TEST_PARTS=str(FAKE))
    result = tmp_path / "r.json"
    cmd = [sys.executable, str(SCRIPT), "--run-part", "hangs", "--result", str(result)]
    cmd += ["--deadline", str(time.time() + 0.5), "--out", str(tmp_path / "o.json")]
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, timeout=60, start_new_session=True)
    assert proc.returncode == -9 and time.monotonic() - started < 15
    found = json.loads(result.read_text())
    assert found["status"] == "running" and found["result"]["rounds_done"] == 1
    assert _gone(found["result"]["grandchild"])


def test_an_explained_failure_is_one_line_without_a_traceback(fake: dict[str, Any]) -> None:
    found = fake["saved"]["explains"]
    assert found["error"] == "dvc is not installed"
    assert "traceback" not in found


def test_exit_code_file_bookkeeping_and_log(fake: dict[str, Any]) -> None:
    assert fake["proc"].returncode == 1  # some parts failed
    assert fake["seconds"] < 30
    run = fake["saved"]["gpu_check"]["runs"][-1]
    assert run["boxes_s"]["hangs"] == 2 and run["budget_s"] == 480
    assert fake["saved"]["peak_memory_mib"] == {"works": 12.5, "last": 12.5}
    assert "===== hangs (box 2 s)" in fake["log"].read_text()


def test_a_budget_under_the_boxes_scales_them_and_is_kept(tmp_path: Path) -> None:
    """Boxes 20 + 6 + 20 s, budget 8 s (5 s after the parent's margin): each part may
    use its box but leaves the later ones their scaled share (x 5/46)."""
    out = tmp_path / "check.json"
    started = time.monotonic()
    args = ("--device", "cpu", "--parts", "works,sleeps,after", "--budget", "8")
    proc, lines, saved = gpu_check(out, *args, fake=True)
    assert time.monotonic() - started < 8
    assert [next(iter(line)) for line in lines] == ["works", "sleeps", "after"]
    assert saved["gpu_check"]["runs"][-1]["box_scale"] == round(5 / 46, 3)
    error = saved["sleeps"]["error"]  # it sleeps 5 s; ~2.5 s were left to it
    assert error.startswith("timed out after ") and error.endswith("(what the budget left it)")
    assert saved["after"]["seen"] == ["works", "sleeps"]
    assert proc.returncode == 1


def test_a_part_with_too_little_budget_is_skipped_with_the_reason(tmp_path: Path) -> None:
    proc, _, saved = gpu_check(
        tmp_path / "c.json", "--parts", "works", "--budget", "3.5", fake=True
    )
    assert saved["works"] == {
        "skipped": "0.5 s of the 4 s budget left for it (its time box: 20 s, scaled 0 s)"
    }
    assert proc.returncode == 1


def test_a_second_invocation_merges_into_the_same_file(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    gpu_check(out, "--device", "cpu", "--parts", "works", fake=True)
    proc, _, saved = gpu_check(out, "--device", "cpu", "--parts", "explains", fake=True)
    assert {"works", "explains"} <= set(saved) and len(saved["gpu_check"]["runs"]) == 2
    assert proc.returncode == 1


def test_unknown_part_names_are_refused(tmp_path: Path) -> None:
    proc, _, _ = gpu_check(tmp_path / "x.json", "--parts", "works,nope", fake=True)
    assert proc.returncode == 2 and "unknown parts ['nope']" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_it_reports_the_environment_says_so_and_exits_2(tmp_path: Path) -> None:
    proc, lines, saved = gpu_check(tmp_path / "check.json")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == NO_CUDA
    env = saved["environment"]
    assert env["cuda_available"] is False and env["error"] == NO_CUDA
    assert env["torch"] == torch.__version__ and "dvc" in env["packages"]
    assert saved["throughput.wideresnet28x10"] == {"skipped": "no CUDA device"}
    assert next(iter(lines[0])) == "environment"


def test_a_real_part_on_the_cpu(tmp_path: Path) -> None:
    """bf16_vs_fp32 at toy sizes (a few seconds): the child set-up of the real parts."""
    args = ("--device", "cpu", "--quick", "--parts", "bf16_vs_fp32")
    proc, _, saved = gpu_check(tmp_path / "c.json", *args)
    assert proc.returncode == 0, proc.stderr
    found = saved["bf16_vs_fp32"]
    assert [r["precision"] for r in found["runs"].values()] == ["fp32", "bf16"]
    assert found["tolerance"]["accuracy_pp"] == 1.0 and isinstance(found["within_tolerance"], bool)
    assert set(found["runs"]["fp32"]["sha256"]) == {"posterior", "map_log_probs", "swag_log_probs"}
    assert saved["environment"]["numerics"]["threads"] == "1"


def test_paced_rounds_stop_where_another_would_not_fit() -> None:
    from gpu_check_parts import paced

    left = iter([100.0, 2.2])  # seconds left, asked before the second and third rounds
    done = []
    for r in paced(5, lambda: next(left), reserve=2.0):
        done.append(r)
        time.sleep(0.2)
    assert done == [0, 1]  # the third would need 1.5 x 0.2 + 2 s > 2.2 s


def test_toy_pipeline_params_are_valid() -> None:
    from gpu_check_pipeline import toy_pipeline

    from bayesavg.config import parse_params

    p = parse_params(toy_pipeline("cpu"))
    assert p.device == "cpu" and p.model.name == "mlp"


def test_the_pipeline_part_says_in_one_line_that_dvc_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.util

    import gpu_check_pipeline
    from gpu_check_runner import Context, PartError

    real = importlib.util.find_spec
    hidden = lambda name, *a: None if name == "dvc" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", hidden)
    ctx = Context("cpu", True, time.time() + 60, tmp_path / "r.json")
    with pytest.raises(PartError, match=r"^dvc not installed for .*: the pipeline part runs"):
        gpu_check_pipeline.pipeline(ctx)


@pytest.mark.slow
def test_every_real_part_at_toy_sizes_on_the_cpu(tmp_path: Path) -> None:
    """All parts, --device cpu --quick (about 60 s on 2 cores): every key is there."""
    proc, lines, saved = gpu_check(tmp_path / "all.json", "--device", "cpu", "--quick", timeout=400)
    names = ["environment", "bf16_vs_fp32", "determinism", "cpu_vs_cuda", "evaluation"]
    names += ["throughput.preresnet20", "throughput.wideresnet28x10"]
    assert [next(iter(line)) for line in lines] == names
    for name in names:
        assert "error" not in saved[name] and "skipped" not in saved[name], saved[name]
    assert proc.returncode == 0, proc.stderr
    det = saved["determinism"]
    assert det["bitwise_equal"] is True
    assert det["mnist5k_lenet5_fp32"]["other_process"]["bitwise_equal"] is True
    assert saved["cpu_vs_cuda"]["weights_relative_difference"] == 0.0
    ev = saved["evaluation"]
    assert ev["ours_over_bound"] > 0 and ev["goal_ours_over_bound"] == 1.10
    for model in ("preresnet20", "wideresnet28x10"):
        found = saved[f"throughput.{model}"]
        assert found["images_per_s"]["ours"] > 0 and found["ours_over_bare"] > 0
        assert found["goal_ours_over_reference"] == 3.0
        if saved["environment"]["swag_importable"]:
            assert found["images_per_s"]["reference_swag_code"] > 0
        else:
            assert "reference_swag_code" in found["skipped"]
    peaks = saved["peak_memory_mib"]
    expected = {"evaluation.ours", "throughput.preresnet20.ours", "bf16_vs_fp32.runs.bf16"}
    assert expected <= set(peaks)
    assert all(v is None for v in peaks.values())


@pytest.mark.slow
def test_the_pipeline_part_times_each_stage_and_reads_the_metrics(tmp_path: Path) -> None:
    """``repro`` on a two-stage stand-in pipeline (seconds, not the real one's minutes):
    DVC through this interpreter, ``python`` on PATH in the stages, a stage's seconds
    from its ``Running stage`` line, the test metrics read back."""
    from gpu_check_pipeline import repro, stage_env
    from gpu_check_runner import Context

    repo = tmp_path / "repo"
    repo.mkdir()
    metrics = "metrics/evaluate/swag"
    write = f"import json, os; os.makedirs('{metrics}', exist_ok=True); " + "; ".join(
        f"json.dump({{'accuracy': 0.5, 'nll': 1.5}}, open('{metrics}/{name}.json', 'w'))"
        for name in ("swa", "swag")
    )
    stages = {
        "first": {
            "cmd": "python -c 'import time; time.sleep(1)' > a.txt",
            "outs": ["a.txt"],
        },
        "second": {"cmd": f'python -c "{write}"', "deps": ["a.txt"], "outs": ["metrics"]},
    }
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    env = stage_env(repo)
    subprocess.run(
        [sys.executable, "-m", "dvc", "init", "-q", "--no-scm"], cwd=repo, env=env, check=True
    )
    ctx = Context("cpu", True, time.time() + 120, tmp_path / "r.json")
    found = repro(repo, env, ctx)
    assert found["ok"] is True and found["stages_run"] == 2, found
    assert list(found["stage_seconds"]) == ["first", "second"]
    assert found["stage_seconds"]["first"] >= 1.0
    assert found["test"] == {n: {"accuracy": 0.5, "nll": 1.5} for n in ("swa", "swag")}
    assert json.loads(ctx.result_path.read_text())["result"]["running"] == "second"
