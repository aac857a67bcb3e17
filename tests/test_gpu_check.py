"""`make gpu-check` (scripts/gpu_check.py) always reports: each part in a child process
of its own, within its time box, its result in the --out file as soon as it is known.

Misbehaving parts (tests/gpu_check_fake_parts.py, run in place of the real ones through
``$GPU_CHECK_TEST_PARTS``) prove the robustness; the real parts run at toy sizes on the
CPU (one cheap part here, all of them in the slow test)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
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
    # toy sizes: no seed spread was measured for them, so no verdict
    assert found["within_tolerance"] is None and "no seed spread" in found["tolerance"]
    assert set(found["runs"]["fp32"]["sha256"]) == {"posterior", "map_log_probs", "swag_log_probs"}
    assert saved["environment"]["numerics"]["threads"] == "1"


def _short(acc: float, nll: float, swag_nll: float, theta: float) -> dict[str, Any]:
    return {
        "map": {"accuracy": acc, "nll": nll},
        "swag": {"accuracy": acc, "nll": swag_nll},
        "theta": torch.full((4,), theta, dtype=torch.float64),
    }


def test_the_seed_spread_is_the_95th_percentile_of_pairwise_differences() -> None:
    import numpy as np
    from gpu_check_seeds import spread

    accs, nlls = [0.95, 0.962, 0.97, 0.941, 0.958], [0.2, 0.13, 0.15, 0.29, 0.17]
    runs = {
        i: {"map": {"accuracy": a, "nll": n}}
        for i, (a, n) in enumerate(zip(accs, nlls, strict=True))
    }
    found = spread(runs, ["map"])["map"]
    pairs = [(i, j) for i in range(5) for j in range(5) if i != j]
    acc = [100 * abs(accs[i] - accs[j]) for i, j in pairs]
    nll = [abs(nlls[i] - nlls[j]) / nlls[i] for i, j in pairs]
    assert found["accuracy_pp"] == round(float(np.quantile(acc, 0.95)), 3)
    assert found["nll_relative"] == round(float(np.quantile(nll, 0.95)), 4)
    assert found["largest"] == {
        "accuracy_pp": round(max(acc), 3),
        "nll_relative": round(max(nll), 4),
    }


def test_cpu_and_cuda_runs_are_judged_against_the_committed_seed_spread() -> None:
    """The full-size short run has a measured spread; a difference inside it passes, one
    beyond it on any predictor and metric fails; the toy size has no verdict."""
    from gpu_check_compare import PREDICTORS, SEED_SPREAD, compare, tolerance
    from gpu_check_parts import Size, what

    spread = tolerance(what(Size.full()))
    assert spread is not None, f"{SEED_SPREAD}: run scripts/gpu_check_seeds.py"
    assert len(spread["runs"]) >= 10 and set(spread["tolerance"]) == set(PREDICTORS)
    limit = spread["tolerance"]["swag"]["nll_relative"]
    cpu = _short(0.96, 0.2, 0.1, 1.0)
    inside = compare(
        cpu, _short(0.96, 0.2, 0.1 * (1 + limit / 2), 2.0), ("cpu", "cuda"), what(Size.full())
    )
    assert inside["within_tolerance"] is True and inside["weights_relative_difference"] == 1.0
    beyond = compare(
        cpu, _short(0.96, 0.2, 0.1 * (1 + 2 * limit), 1.0), ("cpu", "cuda"), what(Size.full())
    )
    assert beyond["within_tolerance"] is False
    assert "12 CPU seeds" in beyond["tolerance"]["measured_as"]
    toy = compare(cpu, cpu, ("cpu", "cpu"), what(Size.quick()))
    assert toy["within_tolerance"] is None


def test_the_reference_code_imports_beside_a_gpytorch_too_new_for_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """GPU images carry gpytorch >= 1.9, which lacks the lazy tensors swa-gaussian names at
    import: the stand-ins are used anyway, and the real gpytorch is put back after."""
    import importlib

    import gpu_check_reference

    (tmp_path / "gpytorch" / "lazy").mkdir(parents=True)
    (tmp_path / "gpytorch" / "__init__.py").write_text("NEW = True\n")
    (tmp_path / "gpytorch" / "lazy" / "__init__.py").write_text("")
    (tmp_path / "swag").mkdir()
    (tmp_path / "swag" / "__init__.py").write_text(
        "from gpytorch.lazy import RootLazyTensor\ntrain_epoch = 'the loop'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("swag", "gpytorch", "gpytorch.lazy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.invalidate_caches()
    real = importlib.import_module("gpytorch.lazy")
    swag = gpu_check_reference.reference_package()
    assert not isinstance(swag, str) and swag.train_epoch == "the loop"
    assert sys.modules["gpytorch.lazy"] is real and sys.modules["gpytorch"].NEW is True


def test_the_readme_gpu_table_is_the_committed_json_s() -> None:
    """The README's table is scripts/gpu_table.py's output for benchmarks/gpu/*.json."""
    from gpu_table import README, results, spliced, table

    found = results()
    assert found, "no benchmarks/gpu/<gpu>.json"
    text = README.read_text()
    assert spliced(text, table(found)) == text, "run: python scripts/gpu_table.py --write"
    for run in found:
        assert "environment" in run and len(set(run) - {"environment", "note"}) > 0


def test_every_part_s_box_is_in_the_benchmarks_readme() -> None:
    """The README sends a reader to benchmarks/README.md's table for each part's box: every
    part of the three invocations has its row there, with the box it runs under."""
    import re

    import gpu_check as script

    rows: dict[str, int] = {}
    for line in (ROOT / "benchmarks" / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and cells[2].endswith(" s"):
            names = re.findall(r"`([a-z0-9_.]+)`", cells[1].split("(")[0])
            boxes = [int(b) for b in re.findall(r"\d+", cells[2])]
            if len(names) == len(boxes):
                rows.update(zip(names, boxes, strict=True))
    parts = (*script.PARTS, *script.SPEED_PARTS, *script.PIPELINE_PARTS)
    assert {p.name: rows.get(p.name) for p in parts} == {p.name: p.box_s for p in parts}


def test_a_gpu_with_parts_missing_failed_or_skipped_gets_its_column() -> None:
    """A GPU whose calls ran out of device time lacks parts; a part that failed holds its
    error; one skipped, why: its column says so, and the other GPU's cells are unchanged."""
    import copy

    from gpu_table import ROWS, results, table

    first = results()[0]
    second = copy.deepcopy(first)
    second["environment"]["gpu"] = "Another GPU"
    for name in ("cpu_vs_cuda", "pipeline", "peak_memory_mib"):
        second.pop(name, None)
    second["determinism"] = {"error": "RuntimeError: CUDA error: boom", "traceback": "..."}
    second["evaluation"] = {"skipped": "2.0 s of the 150 s budget left for it"}
    second["networks"] = {"error": "timed out after 14 s", "partial": {"networks": {"mlp": {}}}}
    second["bf16_vs_fp32"] = {"error": "timed out after 45 s", "partial": {"what": "runs"}}
    lines = table([first, second]).splitlines()[2:]
    cells = {
        row[0]: line.split(" | ")[-1].rstrip(" |") for row, line in zip(ROWS, lines, strict=True)
    }
    assert cells["CUDA vs CPU test metrics, fp32"] == "not run yet"
    assert cells["two CUDA runs, weights' bytes"] == "failed: RuntimeError"
    assert cells["bf16 vs fp32 test metrics"] == "failed: timed out after 45 s"
    assert cells["30-sample SWAG evaluation / 30 x (BN pass + forward)"] == (
        "skipped: 2.0 s of the 150 s budget left for it"
    )
    assert cells["default pipeline, toy sizes, `dvc repro` on CUDA"] == "not run yet"
    assert cells[ROWS[2][0]] == "1 of 1 ran, then stopped: timed out after 14 s"
    alone = table([first]).splitlines()
    assert [line.rsplit(" | ", 1)[0] for line in lines] == [line[:-2] for line in alone[2:]]


def test_the_pipeline_part_splits_each_stage_s_seconds_from_the_ledger(tmp_path: Path) -> None:
    """A stage of two MLflow runs (evaluate@<trajectory>) sums them; a stage with no
    ledger entry (it failed, or keeps none) is all DVC and launch."""
    from gpu_check_pipeline import split

    (tmp_path / "runs").mkdir()
    entries = {"a": ("first", 1.0, 2.0, 0.5), "b": ("first", 0.5, 1.0, 0.0)}
    for name, (stage, startup, compute, finish) in entries.items():
        seconds = {"startup": startup, "compute": compute, "finish": finish}
        record = {"stage": "x", "dvc_stage": stage, "seconds": seconds}
        (tmp_path / "runs" / f"{name}.json").write_text(json.dumps(record))
    (tmp_path / "runs" / "torn.json").write_text('{"stage": ')  # being written
    found = split(tmp_path, {"first": 6.0, "second": 1.5})
    first = {"startup": 1.5, "compute": 3.0, "finish": 0.5, "dvc_and_launch": 1.0}
    assert found["stage_split_seconds"] == {"first": first, "second": {"dvc_and_launch": 1.5}}
    assert found["split_seconds"] == {
        "startup": 1.5,
        "compute": 3.0,
        "finish": 0.5,
        "dvc_and_launch": 2.5,
    }


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--targets", "data"], "--targets is for --pipeline"),
        (["--jobs", "4"], "--jobs is for --pipeline"),
        (["--pipeline", "--jobs", "0"], "--jobs must be at least 1"),
    ],
)
def test_pipeline_options_are_for_the_pipeline_invocation_only(
    tmp_path: Path, given: list[str], said: str
) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "t.json"), *given],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and said in proc.stderr
    assert not (tmp_path / "t.json").exists()


def test_the_pipeline_part_runs_stages_side_by_side_unless_the_gpu_is_exclusive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gpu_check_pipeline
    from gpu_check_runner import JOBS

    from bayesavg.runtime import numerics

    monkeypatch.delenv(JOBS, raising=False)
    monkeypatch.setattr(numerics, "usable_cores", lambda: 16)
    monkeypatch.setattr(gpu_check_pipeline, "exclusive_gpu", lambda: False)
    assert gpu_check_pipeline.lanes("cuda")[0] == gpu_check_pipeline.MAX_LANES == 8
    monkeypatch.setattr(numerics, "usable_cores", lambda: 2)
    assert gpu_check_pipeline.lanes("cuda")[0] == 2
    monkeypatch.setattr(gpu_check_pipeline, "exclusive_gpu", lambda: True)
    assert gpu_check_pipeline.lanes("cuda") == (
        1,
        "the GPU's compute mode is exclusive: one process at a time",
    )
    assert gpu_check_pipeline.lanes("cpu")[0] == 2
    monkeypatch.setenv(JOBS, "5")  # gpu_check.py --pipeline --jobs 5
    assert gpu_check_pipeline.lanes("cuda") == (5, "--jobs")


def test_the_exclusive_compute_mode_is_read_from_nvidia_smi(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import gpu_check_pipeline

    smi = tmp_path / "nvidia-smi"
    for mode, exclusive in (("Default", False), ("Exclusive_Process", True)):
        smi.write_text(f"#!/bin/sh\necho {mode}\n")
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", str(tmp_path))
        assert gpu_check_pipeline.exclusive_gpu() is exclusive
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert gpu_check_pipeline.exclusive_gpu() is False  # no nvidia-smi: nothing says so


def test_paced_rounds_stop_where_another_would_not_fit() -> None:
    from gpu_check_parts import paced

    left = iter([100.0, 2.2])  # seconds left, asked before the second and third rounds
    done = []
    for r in paced(5, lambda: next(left), reserve=2.0):
        done.append(r)
        time.sleep(0.2)
    assert done == [0, 1]  # the third would need 1.5 x 0.2 + 2 s > 2.2 s


def test_an_estimate_from_earlier_rounds_guards_the_first_round_too() -> None:
    from gpu_check_parts import paced

    assert list(paced(3, lambda: 10.0, reserve=2.0, longest=6.0)) == []  # 11 s > 10 s
    assert list(paced(1, lambda: 10.0, reserve=2.0, longest=5.0)) == [0]  # 9.5 s fits


def test_compiling_variants_join_after_a_round_of_the_others(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cold compile of a deep network can outlast the part's box: the other variants'
    numbers are timed and reported before it starts. A round a late variant missed is
    ``None``, and its ratios pair only the rounds both timed."""
    import gpu_check_measure
    from gpu_check_parts import Size
    from gpu_check_runner import Context
    from gpu_check_speed import _summary

    monkeypatch.setattr(
        Size, "of", classmethod(lambda cls, ctx: dataclasses.replace(Size.quick(), rounds=3))
    )
    events: list[str] = []
    reports: list[dict[str, Any]] = []

    def builder(name: str, seconds: float) -> Callable[[], Callable[[], None]]:
        def build() -> Callable[[], None]:
            events.append(f"build {name}")
            return lambda: (events.append(name), time.sleep(seconds))

        return build

    builders = {
        "eager": builder("eager", 0.06),
        "compiled": builder("compiled", 0.01),
        "graphs": builder("graphs", 0.01),
    }
    ctx = Context("cpu", True, time.time() + 60, tmp_path / "r.json")
    monkeypatch.setattr(ctx, "report", reports.append)
    found = gpu_check_measure.measure(
        builders,
        dict.fromkeys(builders, True),
        {},
        100,
        ctx,
        _summary("preresnet20"),
        frozenset({"compiled"}),
    )
    first_round = events[: events.index("build compiled")]
    # each built with its warm-up epoch, then a timed round of both, before any compile
    assert first_round == ["build eager", "eager", "build graphs", "graphs", "eager", "graphs"]
    # reported after each build and each round: eager, graphs, round 0, then compiled
    assert reports[2]["rounds_done"] == {"eager": 1, "graphs": 1}
    assert reports[2]["images_per_s"].keys() == {"eager", "graphs"}
    assert found["rounds_done"] == {"eager": 3, "graphs": 3, "compiled": 2}
    assert (
        set(found["over_eager"]) == {"compiled", "graphs"} and found["over_eager"]["compiled"] > 1
    )


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


@pytest.mark.slow  # the real pipeline in a scratch DVC repo (~22 s on 2 cores)
def test_the_pipeline_part_runs_the_real_pipeline_and_goes_on_in_a_kept_repo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The scratch repo holds the project's pipeline as DVC reads it (every param and
    folder ``dvc.yaml`` names: a new ``${model.code}`` once stopped it at parse time),
    and with ``--repo`` a second invocation skips what the first finished."""
    import gpu_check_pipeline
    from gpu_check_runner import KEPT_REPO, TARGETS, Context

    repo = tmp_path / "kept"
    monkeypatch.setenv(KEPT_REPO, str(repo))
    monkeypatch.setenv(TARGETS, "validate")
    ctx = Context("cpu", True, time.time() + 120, tmp_path / "r.json")
    first = gpu_check_pipeline.pipeline(ctx)
    assert first["ok"] is True, first.get("error_tail")
    assert first["stages_done_before"] == 0 and list(first["stage_seconds"]) == ["validate"]
    listed = subprocess.run(
        [sys.executable, "-m", "dvc", "stage", "list", "--name-only"],
        cwd=repo,
        env=gpu_check_pipeline.stage_env(repo),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    declared = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert {s.split("@")[0] for s in listed} == set(declared)
    (repo / "src/bayesavg/seeding.py").unlink()  # the next invocation restores the code
    again = gpu_check_pipeline.pipeline(ctx)
    assert again["ok"] is True and again["stages_done_before"] == 1, again
    assert again["stages_run"] == 0  # the same bytes: validate is up to date


@pytest.mark.slow
def test_every_real_part_at_toy_sizes_on_the_cpu(tmp_path: Path) -> None:
    """All parts, --device cpu --quick (about 60 s on 2 cores): every key is there."""
    proc, lines, saved = gpu_check(tmp_path / "all.json", "--device", "cpu", "--quick", timeout=400)
    names = ["environment", "networks", "bf16_vs_fp32", "determinism", "cpu_vs_cuda"]
    names += ["evaluation", "throughput.preresnet20", "throughput.wideresnet28x10"]
    assert [next(iter(line)) for line in lines] == names
    for name in names:
        skipped = saved[name].get("skipped", {})
        assert "error" not in saved[name], saved[name]
        # only the reference code may be missing (make bench-install)
        assert isinstance(skipped, dict) and set(skipped) <= {"reference_swag_code"}, skipped
    # exit 1 where a part is incomplete: here, the reference code not installed
    assert proc.returncode == (0 if saved["environment"]["swag_importable"] else 1), proc.stderr
    assert all(r["ok"] for r in saved["networks"]["networks"].values())
    assert len(saved["networks"]["networks"]) == 27
    det = saved["determinism"]
    assert det["bitwise_equal"] is True
    assert det["mnist5k_lenet5_fp32"]["other_process"]["bitwise_equal"] is True
    assert saved["cpu_vs_cuda"]["weights_relative_difference"] == 0.0
    assert saved["cpu_vs_cuda"]["first_gradient"]["relative_difference"] == 0.0
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
def test_the_pipeline_part_times_each_stage_and_reads_the_metrics(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``repro`` on a three-stage stand-in pipeline (seconds, not the real one's
    minutes): DVC through this interpreter, ``python`` on PATH in the stages, a stage's
    seconds from ``scripts/repro.py``'s line at its end, the test metrics read back,
    two independent stages side by side."""
    from gpu_check_pipeline import repro, stage_env
    from gpu_check_runner import TARGETS, Context

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
        "third": {"cmd": "python -c 'import time; time.sleep(2)' > c.txt", "outs": ["c.txt"]},
    }
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    env = stage_env(repo)
    subprocess.run(
        [sys.executable, "-m", "dvc", "init", "-q", "--no-scm"], cwd=repo, env=env, check=True
    )
    ctx = Context("cpu", True, time.time() + 120, tmp_path / "r.json")
    monkeypatch.setenv(TARGETS, "first")  # gpu_check.py --targets first
    seconds = repro(repo, env, ctx)["stage_seconds"]
    assert seconds.keys() == {"first"} and seconds["first"] >= 1.0  # its sleep
    monkeypatch.delenv(TARGETS)
    found = repro(repo, env, ctx, jobs=2)  # the rest: first is up to date
    assert found["ok"] is True and set(found["stage_seconds"]) == {"second", "third"}, found
    assert found["stage_seconds"]["third"] >= 2.0 and found["jobs"] == 2
    assert found["test"] == {n: {"accuracy": 0.5, "nll": 1.5} for n in ("swa", "swag")}
    reported = json.loads(ctx.result_path.read_text())["result"]
    assert reported["stages_run"] == 2 and reported["running"] == []  # at the last end
    stages["third"]["cmd"] = "python -c 'raise SystemExit(3)'"
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    failed = repro(repo, env, ctx, jobs=2)
    assert failed["ok"] is False and failed["exit_code"] == 3, failed  # the stage's own code
    assert failed["failed_stages"] == {"third": f"failed (exit code {failed['exit_code']})"}


def test_the_speed_summary_and_the_protocol_projection() -> None:
    """Speed-ups are per-round ratios to eager; the projection is the stated arithmetic."""
    from gpu_check_protocol import (
        PROTOCOL_GOAL,
        cifar10,
        ours_monitored,
        projection,
        protocol_hours,
        reference_monitored,
    )
    from gpu_check_speed import _summary

    p = cifar10()  # presets/cifar10.yaml: 300 epochs, snapshots after epoch 161 on, 30
    assert (p.epochs, p.first_snapshot, p.train, p.val, p.samples) == (300, 161, 45_000, 5_000, 30)
    assert (p.every, p.fraction) == (5, 0.3)
    # ours: 60 due epochs (5, 10, ..., 300), 30% of val and test each; the 28 of them
    # after the first snapshot (165, ..., 300) also 30% of train and of test again
    assert ours_monitored(p) == 60 * (1_500 + 3_000) + 28 * (13_500 + 3_000)
    # run_swag.py: 61 test passes (epoch 0 and every 5th: 4, 9, ..., 299), 139 collecting
    # epochs' test predictions, and on the 28 collecting evaluation epochs (164, ..., 299)
    # a BN pass and a test pass
    assert reference_monitored(p) == 61 * 10_000 + 139 * 10_000 + 28 * 55_000
    train, evaluation = 300 * 45_000, 30 * 55_000
    assert protocol_hours(p, 1000.0, 0.0) == pytest.approx((train + evaluation / 3) / 1000 / 3600)
    assert protocol_hours(p, 1000.0, 3000.0) - protocol_hours(p, 1000.0, 0.0) == pytest.approx(
        1000 / 1000 / 3600
    )
    measured = (train / 1000 + (evaluation + 3000) / 4000) / 3600  # forward images at 4000/s
    assert protocol_hours(p, 1000.0, 3000.0, 4000.0) == pytest.approx(measured)
    assumed = projection(100.0, 5.0, {"ours": 400.0})  # one side measured: both assumed
    assert assumed["protocol_forward"] == "assumed a third of a training image"
    both = projection(100.0, 5.0, {"ours": 400.0, "reference_swag_code": 10.0})
    assert both["protocol_forward"] == "measured"
    ours_h = protocol_hours(p, 100.0, ours_monitored(p), 400.0)
    assert both["protocol_hours"]["ours"] == round(ours_h, 2)
    theirs_h = protocol_hours(p, 5.0, reference_monitored(p), 10.0)
    assert both["protocol_reference_over_ours"] == round(theirs_h / ours_h, 2)
    seconds = {"eager": [2.0, 4.0], "compiled": [1.0, 1.0], "graphs": [1.0, 4.0]}
    found = _summary("preresnet20")({}, 100, seconds)
    assert found["over_eager"] == {"compiled": 3.0, "graphs": 1.5}
    assert found["best"] == "compiled" and found["goal_met"] is True
    seconds["reference_swag_code"] = [20.0, 20.0]
    found = _summary("preresnet164")({}, 100, seconds)
    assert "goal_met" not in found
    hours = found["protocol_hours"]
    assert hours["ours"] == round(protocol_hours(p, 100.0, ours_monitored(p)), 2)
    assert hours["reference_swag_code"] == round(protocol_hours(p, 5.0, reference_monitored(p)), 2)
    assert hours["reference_swag_code_unmonitored"] == round(protocol_hours(p, 5.0, 0.0), 2)
    assert found["protocol_reference_over_ours"] > found["protocol_unmonitored_reference_over_ours"]
    assert found["protocol_goal_met"] is (found["protocol_reference_over_ours"] >= PROTOCOL_GOAL)
    seconds["bare_pytorch"] = [1.0, 5.0]  # per round: eager 0.5x bare, then 1.25x
    assert _summary("preresnet164")({}, 100, seconds)["eager_over_bare"] == 0.875
    seconds["graphs_unpinned_kernels"] = [0.5, 1.0]  # per round: graphs 2x, then 4x
    found = _summary("preresnet164")({}, 100, seconds)
    assert found["unpinned_kernels_over_graphs"] == 3.0
    assert "graphs_unpinned_kernels" not in found["over_eager"] and found["best"] == "compiled"
    assert found["protocol_hours"]["ours"] == hours["ours"]  # the default's: deterministic
    rate = found["images_per_s"]["graphs_unpinned_kernels"]
    assert rate == round(100 / 0.75, 1)  # its median round: 0.75 s
    fast = protocol_hours(p, rate, ours_monitored(p))
    assert found["protocol_hours"]["ours_deterministic_false"] == round(fast, 2)
    theirs = protocol_hours(p, 5.0, reference_monitored(p))
    assert found["protocol_reference_over_ours_deterministic_false"] == round(theirs / fast, 2)


@pytest.mark.slow
def test_the_speed_parts_at_toy_sizes_on_the_cpu(tmp_path: Path) -> None:
    """--speed --device cpu --quick (about 30 s): eager and graph-ready steps timed."""
    _, lines, saved = gpu_check(tmp_path / "s.json", "--speed", "--device", "cpu", "--quick")
    names = ["environment", "speed.preresnet20", "speed.wideresnet28x10", "speed.preresnet164"]
    order = [names[0], "step_variants", *names[1:], "throughput.resnet50"]
    assert [next(iter(line)) for line in lines] == order
    variants = saved["step_variants"]
    assert variants["ok"] is True and variants["graphs_bitwise_equal"] is True, variants
    assert variants["variants"]["compiled"] == {"skipped": "compiling on the CPU takes minutes"}
    assert variants["bf16_vs_fp32"] == {
        "skipped": "no compiled variant to judge (--quick on the CPU)"
    }
    for name in names[1:]:
        found = saved[name]
        assert "error" not in found and "failed" not in found, found
        assert found["images_per_s"]["eager"] > 0 and found["over_eager"]["graphs"] > 0
        assert "compiled" in found["skipped"]
    resnet = saved["throughput.resnet50"]
    assert set(resnet["images_per_s"]) == {"ours", "ours_streamed", "bare_pytorch"}, resnet


def test_the_gpu_table_shows_the_speed_parts_once_they_ran() -> None:
    from gpu_table import _protocol, _speed

    assert _speed({}, "preresnet20") == "not run yet (`--speed`)"
    part = {
        "over_eager": {"compiled": 1.5, "graphs": 2.5, "compiled_graphs": 3.0},
        "goal_met": True,
        "images_per_s": {"eager": 1000.0},
        "protocol_hours": {"ours": 2.0, "reference_swag_code": 12.5},
        "protocol_reference_over_ours": 6.25,
        "protocol_goal_met": True,
    }
    found = {"speed.preresnet20": part, "speed.preresnet164": part}
    assert _speed(found, "preresnet20") == (
        "compiled_graphs 3.00x; graphs 2.50x; compiled 1.50x (met); eager 1000 img/s"
    )
    unpinned = {**part, "unpinned_kernels_over_graphs": 1.1, "eager_over_bare": 0.97}
    assert _speed({"speed.preresnet20": unpinned}, "preresnet20").endswith(
        "eager 1000 img/s; eager / bare PyTorch 0.97x; "
        "graphs with `deterministic: false` 1.10x graphs"
    )
    assumed = "; forward images assumed at a third of a training image's cost"
    assert _protocol(found) == "6.2x (met): 2.00 h vs 12.50 h" + assumed
    bare = {**part, "protocol_unmonitored_reference_over_ours": 5.8, "protocol_forward": "measured"}
    assert _protocol({"speed.preresnet164": bare}) == (
        "6.2x (met): 2.00 h vs 12.50 h (5.8x without the reference's monitoring)"
    )
    fast = {**bare, "protocol_reference_over_ours_deterministic_false": 7.1}
    assert _protocol({"speed.preresnet164": fast}).endswith(
        "monitoring); 7.1x with `deterministic: false`"
    )
    assert _speed({"speed.preresnet20": {"error": "OutOfMemoryError: x"}}, "preresnet20") == (
        "failed: OutOfMemoryError"
    )
    cut = {
        "error": "timed out after 99 s (its time box)",
        "partial": {**part, "rounds_done": {"eager": 1}},
    }
    assert _speed({"speed.preresnet20": cut}, "preresnet20") == (
        "compiled_graphs 3.00x; graphs 2.50x; compiled 1.50x (met); eager 1000 img/s "
        "(cut at its time box after 1 round)"
    )
    assert _protocol({"speed.preresnet164": cut}).endswith("(cut at its time box after 1 round)")
    early = {
        "error": "timed out",
        "partial": {"images_per_s": {"eager": 900.0}, "rounds_done": {"eager": 2}},
    }
    assert _speed({"speed.preresnet20": early}, "preresnet20") == (
        "eager 900 img/s, no other variant timed (cut at its time box after 2 rounds)"
    )
    assert _protocol({"speed.preresnet164": early}) == (
        "not measured (cut at its time box after 2 rounds)"
    )


def test_the_gpu_table_says_how_the_pipeline_part_ran() -> None:
    """One stage at a time (the H100's run: ``running`` a name) or side by side
    (``running`` a list, ``jobs``), finished, cut at its box or failed."""
    from gpu_table import _pipeline

    ok = {"ok": True, "jobs": 8, "targets": "all", "stages_run": 44, "dvc_seconds": 151.2}
    assert _pipeline({"pipeline": ok}) == "all stages: 44 stages ok in 151 s, 8 side by side"
    cut = {"stages_run": 30, "seconds": 200.0, "jobs": 8, "running": ["report", "landscape"]}
    timed_out = {"error": "timed out after 210 s (its time box)", "partial": cut}
    assert _pipeline({"pipeline": timed_out}) == (
        "all stages: 30 stages ok in 200 s, 8 side by side, cut at its time box at "
        "`report`, `landscape`"
    )
    old = {"stages_run": 33, "seconds": 323.0, "running": "evaluate@f_multiswag"}
    assert _pipeline({"pipeline": {"error": "timed out after 329 s", "partial": old}}) == (
        "all stages: 33 stages ok in 323 s, cut at its time box at `evaluate@f_multiswag`"
    )
    failed = {**ok, "ok": False, "stages_run": 3, "failed_stages": {"data": "failed (exit code 1)"}}
    assert _pipeline({"pipeline": failed}) == (
        "all stages: 3 stages ok in 151 s, 8 side by side, failed at `data`"
    )


@pytest.mark.slow  # ~10 s: ResNet-50 at 224 on the CPU; the other parts run in the default suite
def test_resnet50_throughput_at_224_runs_ours_and_the_bare_loop(tmp_path: Path) -> None:
    """Issue 28's gpu-check part at toy size on the CPU: ResNet-50 on 224x224 images with
    the random resized crop and flip, ours against the bare loop; the reference code has
    no ImageNet network, so it is not a variant (not a skip that fails the run). Ours also
    runs with the images streamed from the host (``data.storage: stream``)."""
    from gpu_check_runner import Context
    from gpu_check_throughput import throughput

    ctx = Context("cpu", True, time.time() + 120, tmp_path / "r.json")
    found = throughput("resnet50", ctx)
    assert set(found["images_per_s"]) == {"ours", "ours_streamed", "bare_pytorch"}
    assert found["ours_over_bare"] > 0 and "skipped" not in found and "failed" not in found
    assert found["streamed_over_in_memory"] > 0
    assert found["images_per_epoch"] == 2


def test_the_step_variants_part_compares_each_fast_step_with_eager(tmp_path: Path) -> None:
    """On the CPU the graph-ready step is eager's step (tests/test_graphs.py): the part
    must say so; --quick on the CPU compiles nothing, so it needs no yardstick."""
    from gpu_check_runner import Context
    from gpu_check_variants import max_abs_diff, step_variants

    ctx = Context("cpu", True, time.time() + 120, tmp_path / "r.json")
    found = step_variants(ctx)
    graphs = found["variants"]["graphs"]
    assert graphs["bitwise_equal_to_eager"] is True and graphs["max_abs_diff"] == 0.0
    assert graphs["swag_nll"] == found["variants"]["eager"]["swag_nll"]
    assert found["ok"] is True and "skipped" in found["bf16_vs_fp32"]
    assert found["variants"]["compiled_graphs"] == {"skipped": "compiling on the CPU takes minutes"}
    a = {"theta": torch.tensor([1.0, 2.0]), "buffers": {"m": torch.tensor([0.5])}, "n": 3}
    b = {"theta": torch.tensor([1.0, 2.5]), "buffers": {"m": torch.tensor([-0.5])}, "n": 4}
    assert max_abs_diff(a, b) == 1.0 and max_abs_diff(a, a) == 0.0


def test_one_evaluation_sample_is_timed_for_ours_and_the_reference_says_why_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The projection's forward images/s: ours from the library's evaluate; a reference
    that cannot run is skipped with its reason (the projection then assumes both)."""
    import gpu_check_forward
    from gpu_check_parts import Size

    monkeypatch.setattr(gpu_check_forward, "reference_package", lambda: "not installed here")
    cpu = torch.device("cpu")
    found = gpu_check_forward.forward_rates("preresnet20", cpu, "fp32", 8, Size.quick(), True)
    assert found["skipped"] == {"reference_swag_code": "not installed here"}
    assert set(found["images_per_s"]) == {"ours"} and found["images_per_s"]["ours"] > 0
    assert (found["bn_images"], found["test_images"]) == gpu_check_forward.QUICK


def test_the_gpu_table_shows_how_far_each_fast_step_lands_from_eager() -> None:
    from gpu_table import _variants

    part = {
        "variants": {
            "eager": {"sha256": "a"},
            "graphs": {"bitwise_equal_to_eager": True, "max_abs_diff": 0.0},
            "compiled": {"bitwise_equal_to_eager": False, "max_abs_diff": 2.5e-3},
            "compiled_graphs": {
                "bitwise_equal_to_eager": False,
                "max_abs_diff": 2.5e-3,
                "bitwise_equal_to_compiled": True,
            },
        },
        "bf16_vs_fp32": {"max_abs_diff": 0.0118},
        "ok": True,
    }
    assert _variants({"step_variants": part}) == (
        "graphs eager's bytes; compiled max diff 2.5e-03; compiled_graphs max diff 2.5e-03, "
        "compiled's bytes; bf16 vs fp32 1.2e-02 (met)"
    )
    partial = {k: v for k, v in part.items() if k != "ok"}  # no verdict before the end
    cut = {"error": "timed out after 80 s (its time box)", "partial": partial}
    assert _variants({"step_variants": cut}).endswith(
        "bf16 vs fp32 1.2e-02, then stopped: timed out after 80 s (its time box)"
    )


def test_make_gpu_check_runs_every_speed_part_once() -> None:
    """`make gpu-check` splits --speed in two invocations (PreResNet-164's cold compile
    alone takes minutes): together they name every speed part, none twice."""
    import re

    from gpu_check import BUDGET_S, SPEED_PARTS
    from gpu_check_runner import MARGIN_S

    makefile = (ROOT / "Makefile").read_text()
    light = re.search(r"^GPU_CHECK_SPEED = (\S+)$", makefile, re.M)
    assert light is not None
    deep = re.findall(r"--speed --out \$\(GPU_CHECK_OUT\) --parts (\S+);", makefile)
    assert deep[0] == "$(GPU_CHECK_SPEED)", deep
    named = [*light.group(1).split(","), *deep[1].split(",")]
    assert sorted(named) == sorted(p.name for p in SPEED_PARTS if p.name != "environment")
    boxes = {p.name: p.box_s for p in SPEED_PARTS}
    for parts in (light.group(1).split(","), deep[1].split(",")):  # each fits, unscaled
        assert boxes["environment"] + sum(boxes[n] for n in parts) <= BUDGET_S - MARGIN_S
