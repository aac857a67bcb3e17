"""The launcher of a multi-process stage (``runtime.launch``): a failing rank ends the
job fast with one line (a bug: its traceback), two jobs on one machine do not clash,
and a stop (Ctrl-C to the terminal's process group, SIGTERM to the launcher) ends every
rank through its clean-up and says, as one process does, what a rerun resumes from."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from pipeline_repo import PYTHON, env

from bayesavg.runtime import errors, launch
from bayesavg.runtime.entry import EXIT_INTERRUPTED, EXIT_TERMINATED, RANK_ERRORS_ENV
from bayesavg.runtime.errors import UserError

JOB_DEADLINE = 60.0  # seconds for one torchrun job

LAUNCHED = textwrap.dedent(
    """
    import os
    import sys
    import time
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from bayesavg.runtime import errors, launch
    from bayesavg.runtime.entry import early_interrupts, run_entry
    from bayesavg.runtime.errors import UserError, resumes_from
    from bayesavg.training.distributed import join, leave

    MODE, OUT = sys.argv[1], sys.argv[2]


    def work():
        world = join(torch.device("cpu"))
        if MODE == "ok":
            total = torch.ones(3) * (world.rank + 1)
            dist.all_reduce(total)
            if world.is_main:
                Path(OUT).write_text(str(total.tolist()))
            leave(world)
            return
        if MODE == "wait":  # until stopped; rank 0 holds the stage's checkpoint
            if world.is_main:
                resumes_from("checkpoints/job.pt")
            try:
                Path(f"{OUT}.ready{world.rank}").write_text("")
                while True:
                    time.sleep(0.05)
            finally:
                Path(f"{OUT}.cleaned{world.rank}").write_text("")
        if world.rank == 1:
            if MODE == "user":
                raise UserError("shard 7 is empty; lower clients")
            raise ValueError("an unexpected bug in rank one")
        dist.recv(torch.zeros(1), src=1)  # waits for rank 1, which never sends
        Path(OUT).write_text("rank 0 was never stopped")


    if __name__ == "__main__":
        if launch.should_relaunch():  # as a stage's launcher: one line, the exit code
            run_entry(lambda: launch.relaunch(sys.argv))
        elif MODE == "importing":  # a rank still importing its stage's code
            early_interrupts()
            Path(f"{OUT}.ready{os.environ['RANK']}").write_text("")
            while True:
                time.sleep(0.05)
        else:
            sys.exit(launch.rank_entry(work))
    """
)


def _launch(tmp_path: Path, mode: str, out: str) -> subprocess.Popen[str]:
    script = tmp_path / "launched.py"
    if not script.exists():
        script.write_text(LAUNCHED)
    scratch = _scratch(tmp_path, out)
    scratch.mkdir()
    environ = env(BAYESAVG_NPROC="2", TMPDIR=str(scratch))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environ.pop(name, None)
    return subprocess.Popen(
        [PYTHON, str(script), mode, str(tmp_path / out)],
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal gives a command
    )


def _scratch(folder: Path, out: str) -> Path:
    """The job's own temporary folder ($TMPDIR), to see what it leaves there."""
    return folder / f"tmp-{out}"


def _left_behind(folder: Path, out: str) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in _scratch(folder, out).rglob("*"))


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """The job's exit code and stderr; it fails the test if it runs past the deadline."""
    try:
        _, err = proc.communicate(timeout=JOB_DEADLINE)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the job ran past {JOB_DEADLINE} s:\n{err}") from None
    return proc.returncode, err


@pytest.fixture(scope="module")
def user_error_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    """Rank 1 raises a UserError while rank 0 waits for it: (exit code, stderr, folder)."""
    folder = tmp_path_factory.mktemp("user_error_job")
    code, err = _finish(_launch(folder, "user", "out"))
    return code, err, folder


def test_a_rank_user_error_ends_the_job_fast(user_error_job: tuple[int, str, Path]) -> None:
    code, err, folder = user_error_job  # within JOB_DEADLINE, or _finish failed it
    assert code == 2, err
    assert err.strip().splitlines()[-1] == "error: rank 1 of 2: shard 7 is empty; lower clients"
    assert "Traceback" not in err
    assert not (folder / "out").exists(), "rank 0 went on after its peer failed"
    assert _left_behind(folder, "out") == [], "torchrun made a torchelastic_* folder per job"


def test_a_rank_user_error_is_the_only_line(user_error_job: tuple[int, str, Path]) -> None:
    """errors.py: a UserError is one line on stderr, also from a rank of a torchrun job."""
    _, err, _ = user_error_job
    assert err.strip().splitlines() == ["error: rank 1 of 2: shard 7 is empty; lower clients"]


def test_a_rank_bug_ends_the_job_with_its_traceback(tmp_path: Path) -> None:
    code, err = _finish(_launch(tmp_path, "bug", "out"))
    assert code != 0
    assert "Traceback" in err and 'raise ValueError("an unexpected bug in rank one")' in err
    last = err.strip().splitlines()[-1]
    assert last == "error: rank 1 of 2: ValueError: an unexpected bug in rank one", err
    assert err.count("Traceback") == 1, "only the failing rank's traceback"
    assert not (tmp_path / "out").exists()
    assert _left_behind(tmp_path, "out") == []


@pytest.mark.slow  # ~16 s on 2 cores: two torchrun jobs
def test_two_jobs_at_once_do_not_clash(tmp_path: Path) -> None:
    jobs = [_launch(tmp_path, "ok", f"out{i}") for i in range(2)]
    for proc in jobs:
        code, err = _finish(proc)
        assert code == 0, err
    for i in range(2):
        assert (tmp_path / f"out{i}").read_text() == "[3.0, 3.0, 3.0]"
        assert _left_behind(tmp_path, f"out{i}") == []


def _started(proc: subprocess.Popen[str], out: Path) -> None:
    """Wait until both ranks of a ``wait`` job are in their loop."""
    deadline = time.monotonic() + JOB_DEADLINE
    while not all(Path(f"{out}.ready{rank}").exists() for rank in range(2)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the job did not start its ranks:\n{proc.communicate()[1]}")
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("stop", "code", "line"),
    [
        ("ctrl_c", EXIT_INTERRUPTED, "interrupted by Ctrl-C (SIGINT)"),
        ("sigterm", EXIT_TERMINATED, "interrupted by SIGTERM"),
    ],
)
def test_a_stopped_job_says_one_line_with_rank_0_s_checkpoint(
    tmp_path: Path, stop: str, code: int, line: str
) -> None:
    """Ctrl-C reaches every process of the group (each rank gets it twice: torchrun passes
    its own on); SIGTERM (a timeout, ``kill``) reaches the launcher only. Either way: the
    single-process line and exit code, no traceback of torchrun's, each rank's clean-up."""
    proc = _launch(tmp_path, "wait", "out")
    _started(proc, tmp_path / "out")
    if stop == "ctrl_c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    found, err = _finish(proc)
    assert found == code, err
    assert err.strip().splitlines() == [
        f"{line}: stopped; run it again to resume from checkpoints/job.pt"
    ]
    assert all((tmp_path / f"out.cleaned{rank}").exists() for rank in range(2))
    assert _left_behind(tmp_path, "out") == []


def test_ranks_stopped_while_importing_leave_the_line_to_the_launcher(tmp_path: Path) -> None:
    """Before a rank runs ``rank_entry`` (its imports, seconds) a stop ends it at once,
    silently: the launcher's is the one line (it printed one per rank as well)."""
    proc = _launch(tmp_path, "importing", "out")
    _started(proc, tmp_path / "out")
    os.killpg(proc.pid, signal.SIGINT)
    found, err = _finish(proc)
    assert found == EXIT_INTERRUPTED, err
    assert err.strip().splitlines() == [
        "interrupted by Ctrl-C (SIGINT): stopped; run it again (pretrain and fine-tuning "
        "stages resume from their last checkpoint)"
    ]
    assert _left_behind(tmp_path, "out") == []


def test_a_rank_started_by_hand_says_its_stop_itself(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outside ``relaunch`` (torchrun run by hand, README) there is no launcher to say it."""
    monkeypatch.delenv(launch.RANK_ERRORS_ENV, raising=False)
    monkeypatch.setattr(errors._Resume, "path", None)  # no checkpoint saved in this process
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def stopped() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    def unhandled(signum: int, frame: object) -> None:  # rank_entry must replace it
        raise AssertionError("rank_entry left SIGTERM to the handler before it")

    signal.signal(signal.SIGTERM, unhandled)
    try:
        assert launch.rank_entry(stopped) == EXIT_TERMINATED
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, "a second stop is ignored"
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        "interrupted by SIGTERM: stopped; run it again (pretrain and fine-tuning "
        "stages resume from their last checkpoint)"
    ]


@pytest.mark.parametrize("fails", [False, True])
def test_a_rank_ignores_stops_once_its_part_is_over(
    fails: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """torchrun sends SIGTERM to the other ranks when one fails: a rank already on its way
    out (its part done or failed) must not raise it inside its exit's clean-up, which
    Python reports as "Exception ignored in atexit callback" with a traceback."""
    monkeypatch.delenv(RANK_ERRORS_ENV, raising=False)
    before = {stop: signal.getsignal(stop) for stop in (signal.SIGINT, signal.SIGTERM)}

    def part() -> None:
        if fails:
            raise UserError("shard 7 is empty")

    try:
        code = launch.rank_entry(part)
        after = {stop: signal.getsignal(stop) for stop in before}
    finally:
        for stop, handler in before.items():
            signal.signal(stop, handler)
    assert code == (2 if fails else 0)
    assert after == {signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN}
    assert capsys.readouterr().err == ("error: shard 7 is empty\n" if fails else "")
