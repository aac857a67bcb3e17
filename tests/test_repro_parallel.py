"""scripts/repro.py: DVC stages side by side, with what a plain ``dvc repro`` leaves."""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from pipeline_repo import DVC, ROOT, env, sh

sys.path.insert(0, str(ROOT / "scripts"))

import repro

SCRIPT = str(ROOT / "scripts" / "repro.py")
# A stage that marks its start, then waits (up to a minute) for the marks of the stages
# named after it: two stages that wait for each other finish only when run side by side.
WAITER = (
    "import pathlib, sys, time; me, *others = sys.argv[1:]; d = pathlib.Path('started');"
    " d.mkdir(exist_ok=True); (d / me).touch(); end = time.time() + 60\n"
    "while not all((d / o).exists() for o in others):\n"
    "    time.sleep(0.05)\n"
    "    if time.time() > end: sys.exit(f'{me}: {others} never started beside me')\n"
    "pathlib.Path(me + '.txt').write_text(me)"
)


def _stage(name: str, *others: str, deps: tuple[str, ...] = ()) -> dict[str, object]:
    return {
        "cmd": f"python waiter.py {name} {' '.join(others)}".strip(),
        "deps": ["waiter.py", *deps],
        "outs": [f"{name}.txt"],
    }


def _toy(
    tmp_path: Path, stages: dict[str, dict[str, object]], files: dict[str, str] | None = None
) -> Path:
    """A committed DVC repo of ``stages`` and the scripts they run (``files``)."""
    repo = tmp_path / "toy"
    repo.mkdir()
    for name, text in (files or {"waiter.py": WAITER}).items():
        (repo / name).write_text(text)
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    sh(repo, "git", "init", "-q")
    sh(repo, DVC, "init", "-q")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "toy")
    return repo


def _repro(repo: Path, *args: str, check: bool = True):  # type: ignore[no-untyped-def]
    return sh(repo, sys.executable, SCRIPT, *args, check=check)


def test_independent_stages_run_side_by_side_and_dvc_records_each(tmp_path: Path) -> None:
    repo = _toy(
        tmp_path,
        {
            "a": _stage("a", "b"),
            "b": _stage("b", "a"),
            "c": _stage("c", deps=("a.txt", "b.txt")),
        },
    )
    out = _repro(repo, "--jobs", "2").stdout
    assert {"a", "b", "c"} == set(yaml.safe_load((repo / "dvc.lock").read_text())["stages"])
    assert "Data and pipelines are up to date." in sh(repo, DVC, "status").stdout
    assert out.count("To track the changes with git") == 1  # once, not once per stage
    assert "git add" in out and "dvc.lock" in out.split("git add")[-1]
    assert "a | Running stage 'a'" in out
    ends = [line for line in out.splitlines() if " | finished in " in line]
    assert [line.split()[0] for line in ends][-1] == "c"  # after a and b
    assert [line.split("(")[-1] for line in ends] == ["1 of 3)", "2 of 3)", "3 of 3)"]
    again = _repro(repo, "--jobs", "2").stdout
    assert again.strip() == "Data and pipelines are up to date."


def test_a_changed_stage_reruns_with_what_depends_on_it(tmp_path: Path) -> None:
    repo = _toy(
        tmp_path,
        {"a": _stage("a"), "b": _stage("b"), "c": _stage("c", deps=("a.txt",))},
    )
    _repro(repo, "--jobs", "2")
    (repo / "a.txt").write_text("edited")  # a's output no longer what DVC recorded
    out = _repro(repo, "--jobs", "2").stdout
    assert "2 of 3 stages to check" in out
    assert (repo / "a.txt").read_text() == "a"
    assert "c | Stage 'c' didn't change, skipping" in out  # a's bytes came back the same
    assert "Running stage 'b'" not in out


def test_a_failed_stage_stops_what_depends_on_it_with_its_exit_code(tmp_path: Path) -> None:
    repo = _toy(
        tmp_path,
        {
            "a": {"cmd": "python -c 'raise SystemExit(3)'", "outs": ["a.txt"]},
            "b": _stage("b", deps=("a.txt",)),
        },
    )
    proc = _repro(repo, "--jobs", "2", check=False)
    assert proc.returncode == 3, "the stage's own, not DVC's 255"
    assert re.search(r"^a \| failed \(exit code 3\) in [\d.]+ s \(1 of 2\)$", proc.stdout, re.M)
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: stage a failed (exit code 3); not run: 1 stage(s): b"
    )
    assert not (repo / "b.txt").exists()


def test_a_stage_s_own_error_line_is_repeated_last_with_its_exit_code(tmp_path: Path) -> None:
    """A stage stopping on bad input says why in one line (exit 2): repro ends on that
    line and code, not on DVC's 255 with the reason buried in the stage's output."""
    said = (
        "import sys; print('error: params.yaml: x: must be positive', file=sys.stderr); sys.exit(2)"
    )
    repo = _toy(
        tmp_path,
        {"a": {"cmd": f'python -c "{said}"', "outs": ["a.txt"]}, "b": _stage("b", deps=("a.txt",))},
    )
    proc = _repro(repo, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: stage a failed: params.yaml: x: must be positive (exit code 2); "
        "not run: 1 stage(s): b"
    )


def test_named_stages_bring_their_upstream_only(tmp_path: Path) -> None:
    repo = _toy(
        tmp_path,
        {"a": _stage("a"), "b": _stage("b"), "c": _stage("c", deps=("a.txt",))},
    )
    _repro(repo, "c")
    assert (repo / "c.txt").exists() and not (repo / "b.txt").exists()
    bad = _repro(repo, "nope", check=False)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: no stage nope in dvc.yaml"


def test_a_pipeline_dvc_cannot_read_stops_in_one_line(tmp_path: Path) -> None:
    repo = _toy(tmp_path, {"a": {**_stage("a"), "cmd": "python waiter.py ${missing.key}"}})
    bad = _repro(repo, check=False)
    assert bad.returncode == 2
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("error: ") and "missing.key" in line


def test_the_longest_remaining_chain_starts_first() -> None:
    upstream = {"a": set(), "b": set(), "c": {"a"}, "d": {"c"}, "e": {"b"}}
    rank = repro.priorities(upstream, {"b": 50.0, "e": 1.0})
    # a -> c -> d is 9 s of unknown stages (3 s each); b -> e is 51 s as last recorded
    assert rank == {"a": 9.0, "b": 51.0, "c": 6.0, "d": 3.0, "e": 1.0}


def test_dvc_yaml_s_meta_seconds_order_a_first_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dvc.repo import Repo

    stages = {"a": _stage("a"), "b": {**_stage("b"), "meta": {"seconds": 40}}}
    monkeypatch.chdir(_toy(tmp_path, stages))  # stage names are relative to it
    with Repo() as dvc_repo:
        pipeline = repro.load_graph(dvc_repo, [])
    assert pipeline.upstream == {"a": set(), "b": set()}
    assert pipeline.hinted == {"b": 40.0}


def _hinted_project_stages() -> list[str]:
    """The project's stages whose dvc.yaml entry (or foreach body) has meta.seconds."""
    found = []
    for name, entry in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items():
        body = entry.get("do", entry)
        if isinstance(body.get("meta", {}).get("seconds"), int | float):
            found.append(name)
    return found


def test_the_project_s_long_stages_carry_a_hint() -> None:
    hinted = set(_hinted_project_stages())
    assert {"pretrain", "finetune", "evaluate", "dswag_sweep", "landscape", "report"} <= hinted


def test_stage_seconds_come_from_the_last_run_s_ledger(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    seconds = {"startup": 1.0, "compute": 5.0, "finish": 0.5}
    for name, stage in (("swa", "evaluate@swag"), ("swag", "evaluate@swag")):
        (runs / f"{name}.json").write_text(json.dumps({"dvc_stage": stage, "seconds": seconds}))
    (runs / "validate.json").write_text(json.dumps({"stage": "validate", "seconds": seconds}))
    (runs / "broken.json").write_text("{")
    assert repro.last_seconds(tmp_path) == {"evaluate@swag": 13.0, "validate": 6.5}


@pytest.mark.parametrize(
    ("environ", "cores", "expected"),
    [({}, 2, 2), ({"BAYESAVG_THREADS": "2"}, 2, 1), ({"BAYESAVG_NPROC": "2"}, 16, 8)],
)
def test_jobs_never_run_more_threads_than_cores(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], cores: int, expected: int
) -> None:
    for name in ("BAYESAVG_THREADS", "BAYESAVG_NPROC"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(repro.numerics, "usable_cores", lambda: cores)
    assert repro.default_jobs() == expected
    assert repro.default_jobs(cuda=True) == 1  # one device: one stage at a time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("device: cpu\n", False),
        ("device: cuda:1\n", True),
        ("seed: 0\n", None),  # no device: auto
        ("device: [\n", False),  # unreadable: left to the validate stage
    ],
)
def test_the_device_in_params_decides_whether_stages_share_a_gpu(
    tmp_path: Path, text: str, expected: bool | None
) -> None:
    import torch

    params = tmp_path / "params.yaml"
    params.write_text(text)
    auto = torch.cuda.is_available()
    assert repro.on_cuda(params) == (auto if expected is None else expected)


def test_every_stage_joins_the_runner_s_execution(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT / "stages"))
    import _execution

    named = repro.execution_env(2)[_execution.EXECUTION_ENV]
    monkeypatch.setenv(_execution.EXECUTION_ENV, named)
    found = _execution.execution()
    assert found == json.loads(named)
    assert found["name"].startswith("dvc repro ") and found["mlflow.source.name"] == "dvc repro"
    assert found["bayesavg.runner"] == "scripts/repro.py --jobs 2"
    # no empty tag outside `dvc exp run`; the experiment's name inside it
    assert "dvc_exp_name" not in found and all(found.values())
    assert _execution.described(1, 0.0, "wide", "dvc exp")["dvc_exp_name"] == "wide"


# A stage that opens a tracked run and writes how its tracking worker came to be.
TRACKED = (
    "import pathlib, sys\n"
    "from bayesavg.tracking.worker import Tracker\n"
    "root = pathlib.Path.cwd()\n"
    "tracker = Tracker.spawn(f'sqlite:///{root}/mlflow.db', (root / 'art').as_uri())\n"
    "with tracker.run(sys.argv[1], experiment='e', tags={}, inputs={}) as run:\n"
    "    run.log_metrics({'m': 1.0})\n"
    "pathlib.Path(sys.argv[1] + '.txt').write_text(type(tracker._proc).__name__)"
)


def test_the_stages_tracking_workers_are_forked_from_one_server(tmp_path: Path) -> None:
    stages = {n: {"cmd": f"python tracked.py {n}", "outs": [f"{n}.txt"]} for n in "ab"}
    stages["b"]["deps"] = ["a.txt"]  # not side by side: two stages creating one store race
    repo = _toy(tmp_path, stages)
    (repo / "tracked.py").write_text(TRACKED)
    # the server's socket folder in a temporary directory of this run's own (short: a
    # socket's path has at most 107 bytes), not among those of tests running beside
    tmp = Path(tempfile.mkdtemp(prefix="forks-"))
    try:
        sh(repo, sys.executable, SCRIPT, "--jobs", "2", environ=env(TMPDIR=str(tmp)))
        assert [(repo / f"{n}.txt").read_text() for n in "ab"] == ["Forked", "Forked"]
        assert not list(tmp.glob("bayesavg-forks-*/socket"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
