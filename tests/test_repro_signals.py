"""scripts/repro.py interrupted: its stages' whole process trees stop with it, and a
DVC error is said whole."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from pipeline_repo import ROOT, env, sh
from test_repro_parallel import _toy as toy_repo

sys.path.insert(0, str(ROOT / "scripts"))

import repro

SCRIPT = str(ROOT / "scripts" / "repro.py")
# A stage that starts a grandchild, says both pids, and would write its output (and the
# grandchild its own file) minutes later; each signal it gets is noted in <name>.signals.
SLOW = """\
import os, pathlib, signal, subprocess, sys, time
name = sys.argv[1]
def note(signum, frame):
    with open(f'{name}.signals', 'a') as f:
        f.write(f'{signum}\\n')
    time.sleep(1)  # a second signal, if one were sent, would be noted too
    sys.exit(128 + signum)
signal.signal(signal.SIGINT, note)
signal.signal(signal.SIGTERM, note)
late = "import pathlib, sys, time; time.sleep(300); pathlib.Path(sys.argv[1]).touch()"
child = subprocess.Popen([sys.executable, '-c', late, f'{name}.late'])
pathlib.Path(f'{name}.pid').write_text(f'{os.getpid()} {child.pid}')
time.sleep(300)
pathlib.Path(f'{name}.txt').write_text(name)
"""
MESSAGE = ": stages stopped; rerun to continue (finished stages are kept"


def _toy(tmp_path: Path, stages: dict[str, dict[str, object]]) -> Path:
    return toy_repo(tmp_path, stages, {"slow.py": SLOW})


def _slow(name: str) -> dict[str, object]:
    return {"cmd": f"python slow.py {name}", "deps": ["slow.py"], "outs": [f"{name}.txt"]}


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (an orphan's zombie waits for an init that may never
    reap it: it runs nothing)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A TMPDIR of the test's own, short (the fork server's socket path has at most 107
    bytes), to see that its socket folder goes."""
    tmp = Path(tempfile.mkdtemp(prefix="forks-"))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def _as_from_a_terminal() -> None:
    """SIGINT handled by default, as a command typed at a terminal has it: a test run
    started in the background (``cmd &`` in a script ignores SIGINT in all it starts)
    would pass the ignoring on, and repro.py keeps an ignored signal ignored (nohup)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _started(
    repo: Path, short_tmp: Path, stages: str
) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    """repro.py in a session of its own, once every stage in ``stages`` has started its
    grandchild; with its whole process tree then."""
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, "--jobs", str(len(stages))],
        cwd=repo,
        env=env(TMPDIR=str(short_tmp)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_as_from_a_terminal,
    )
    deadline = time.monotonic() + 120
    while not all((repo / f"{s}.pid").exists() for s in stages):
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate()
            raise AssertionError(f"stages never started:\n{out}\n{err}")
        time.sleep(0.1)
    return proc, psutil.Process(proc.pid).children(recursive=True)


@pytest.mark.parametrize(
    ("how", "signum"),
    [
        ("pid", signal.SIGINT),  # kill -INT <pid>
        ("pid", signal.SIGTERM),  # kill <pid>, a supervisor, `timeout`
        ("group", signal.SIGINT),  # a terminal's Ctrl-C: the whole foreground group
    ],
)
def test_a_signal_stops_every_stage_s_whole_tree_once(
    tmp_path: Path, short_tmp: Path, how: str, signum: int
) -> None:
    repo = _toy(tmp_path, {"a": _slow("a"), "b": _slow("b")})
    proc, tree = _started(repo, short_tmp, "ab")
    pids = {int(p) for s in "ab" for p in (repo / f"{s}.pid").read_text().split()}
    try:
        assert pids <= {p.pid for p in tree}  # the stages and their grandchildren
        if how == "pid":
            os.kill(proc.pid, signum)
        else:
            os.killpg(proc.pid, signum)
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signum, err
        left = [p for p in tree if _alive(p)]
        assert not left, [p.cmdline() for p in left]
        lines = err.strip().splitlines()
        assert len([line for line in lines if "interrupted" in line]) == 1, err
        assert lines[-1].startswith("interrupted by ") and MESSAGE in lines[-1], err
        for s in "ab":  # each stage got the signal once: forwarded, or the terminal's
            assert (repo / f"{s}.signals").read_text().split() == [str(signum)]
            assert not (repo / f"{s}.txt").exists() and not (repo / f"{s}.late").exists()
        assert not (repo / "dvc.lock").exists()
        assert not list(short_tmp.glob("bayesavg-forks-*"))  # the fork server's socket
    finally:
        for p in [psutil.Process(proc.pid), *tree] if proc.poll() is None else tree:
            if _alive(p):
                p.kill()


def test_a_sigkill_of_repro_s_group_still_stops_the_stages(tmp_path: Path, short_tmp: Path) -> None:
    """A time box or a supervisor killing repro.py's process group outright (SIGKILL: no
    handler runs) misses the stages, which run in sessions of their own; each stage's
    ``dvc`` (scripts/dvc_lock.py) sees it was orphaned and passes SIGTERM on to its
    stage's tree."""
    repo = _toy(tmp_path, {"a": _slow("a"), "b": _slow("b")})
    proc, tree = _started(repo, short_tmp, "ab")
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in tree if _alive(p)]
        assert not left, [p.cmdline() for p in left]
        for s in "ab":  # the stage stopped on SIGTERM, before writing anything
            assert (repo / f"{s}.signals").read_text().split() == [str(int(signal.SIGTERM))]
            assert not (repo / f"{s}.txt").exists() and not (repo / f"{s}.late").exists()
    finally:
        for p in tree:
            if _alive(p):
                p.kill()


# A child that starts a grandchild, both ignoring SIGINT and waiting for minutes.
STUBBORN = (
    "import signal, subprocess, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "if len(sys.argv) < 2: subprocess.Popen([sys.executable, __file__, 'grandchild'])\n"
    "time.sleep(300)"
)


def test_what_ignores_the_signal_is_killed_after_the_grace(tmp_path: Path) -> None:
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    stages = repro.Children()
    proc = stages.start([sys.executable, str(tmp_path / "stubborn.py")])
    assert proc is not None
    deadline = time.monotonic() + 60
    while not (tree := psutil.Process(proc.pid).children()):
        assert time.monotonic() < deadline, "no grandchild"
        time.sleep(0.05)
    tree.append(psutil.Process(proc.pid))
    try:
        stages.stop(signal.SIGINT, grace=0.5)
        assert not [p for p in tree if _alive(p)]
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        for p in tree:
            if _alive(p):
                p.kill()


def test_no_stage_starts_once_the_stop_has_begun() -> None:
    stages = repro.Children()
    stages.stop(signal.SIGTERM, grace=0.5)
    assert stages.start([sys.executable, "-c", "raise SystemExit(3)"]) is None


def test_a_busy_output_names_the_process_that_holds_it(tmp_path: Path) -> None:
    repo = _toy(tmp_path, {"a": _slow("a")})
    held = {"pid": os.getpid(), "cmd": "the test holding a.txt"}
    lock = {"read": {}, "write": {str(repo / "a.txt"): held}}
    (repo / ".dvc" / "tmp").mkdir(exist_ok=True)
    (repo / ".dvc" / "tmp" / "rwlock").write_text(json.dumps(lock))
    bad = sh(repo, sys.executable, SCRIPT, check=False)
    assert bad.returncode == 2
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("error: ") and "is busy" in line
    assert f"(PID {os.getpid()}): the test holding a.txt" in line
