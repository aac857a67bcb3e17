"""An output a stage may not write (a read-only disk, another user's folder) ends the
stage with one line naming the file, exit code 2, and nothing half-written; and the line
a stopped stage ends with says what a rerun resumes from, where this process saved a
checkpoint. The refusals here are the kernel's own: a folder without write permission,
or, for root, whom permissions do not stop, sysfs, which refuses every new file."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bayesavg.runtime import io
from bayesavg.runtime.checkpoint import Checkpoint
from bayesavg.runtime.entry import Terminated, run_entry, said_of
from bayesavg.runtime.errors import EXIT_USER_ERROR, UserError, as_user_error, refused, rerun

GENERIC = "run it again (pretrain and fine-tuning stages resume from their last checkpoint)"


@pytest.fixture
def refusing(tmp_path: Path) -> Iterator[Path]:
    """A folder where creating a file fails with EACCES (or EROFS)."""
    if os.geteuid() == 0:
        yield Path("/sys")
        return
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        yield folder
    finally:
        folder.chmod(0o755)


@pytest.fixture(autouse=True)
def _no_checkpoint_yet() -> Iterator[None]:
    """What a rerun resumes from is the process's: start and leave each test without."""
    Checkpoint("unsaved.pt", "k").remove()
    yield
    Checkpoint("unsaved.pt", "k").remove()


def test_the_refusal_is_the_kernel_s(refusing: Path) -> None:
    with pytest.raises(OSError) as caught:
        (refusing / "probe.json").write_text("{}")
    assert caught.value.errno in (errno.EACCES, errno.EROFS)


def test_an_atomic_write_where_it_may_not_names_the_file(refusing: Path) -> None:
    target = refusing / "metrics.json"
    with pytest.raises(UserError) as caught:
        io.write_json(target, {"nll": 0.5})
    said = str(caught.value)
    reason = os.strerror(refused(caught.value).errno).lower()  # type: ignore[union-attr]
    assert said == f"cannot write {target} ({reason}): make its folder writable, then {GENERIC}"
    assert not target.exists()


def test_a_path_inside_the_working_folder_is_named_relative_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    denied = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "runs/a.json"))
    assert str(as_user_error(denied)).startswith("cannot use runs/a.json (permission denied): ")


def test_a_write_outside_the_atomic_path_is_one_line_and_exit_code_2(
    refusing: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file a library opens itself (torchvision's download: ``open(path, "wb")``)."""

    def stage() -> None:
        with open(refusing / "weights.pt", "wb") as f:
            f.write(b"w")

    with pytest.raises(SystemExit) as stop:
        run_entry(stage)
    assert stop.value.code == EXIT_USER_ERROR
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: cannot use {refusing / 'weights.pt'} (")
    assert line.endswith(f"): check its permissions and the disk it is on, then {GENERIC}")


@pytest.mark.parametrize(
    "err",
    [
        PermissionError(errno.EPERM, "Operation not permitted"),  # os.kill: no file
        OSError(errno.EIO, "Input/output error", "a.pt"),
    ],
    ids=["no-file", "another-errno"],
)
def test_other_os_errors_stay_bugs(err: OSError) -> None:
    assert refused(err) is None and as_user_error(err) is None


def test_a_stopped_stage_says_which_checkpoint_a_rerun_resumes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved, resumed from, removed (the stage finished, or its key changed)."""
    monkeypatch.chdir(tmp_path)
    assert rerun() == GENERIC
    ckpt = Checkpoint(tmp_path / "checkpoints" / "finetune@swag.pt", "key")
    ckpt.save({"epoch": 3})
    resumes = "run it again to resume from checkpoints/finetune@swag.pt"
    assert said_of(Terminated()) == f"interrupted by SIGTERM: stopped; {resumes}"
    assert str(as_user_error(OSError(errno.ENOSPC, "full", "x.pt"))).endswith(
        f"free some and {resumes}"
    )
    ckpt.remove()
    assert rerun() == GENERIC
    assert Checkpoint(ckpt.path, "key").load() is None
    ckpt.save({"epoch": 3})
    Checkpoint("elsewhere.pt", "k").remove()
    assert rerun() == GENERIC
    assert Checkpoint(ckpt.path, "key").load() == {"epoch": 3}
    assert rerun() == resumes


def test_a_checkpoint_of_other_params_is_not_what_a_rerun_resumes_from(tmp_path: Path) -> None:
    Checkpoint(tmp_path / "a.pt", "old key").save({"epoch": 1})
    assert rerun().endswith("a.pt")
    assert Checkpoint(tmp_path / "a.pt", "new key").load() is None
    assert rerun() == GENERIC
