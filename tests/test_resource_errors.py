"""A full disk, or a batch too large for the memory, ends a stage, the CLI or a rank with
one line saying what to do, exit code 2, and nothing half-written. A full disk's line
names the file and how much is free: torch's own report of it ("unexpected pos 1487936
vs 1487840") is a traceback of its zip writer. The "no space" errors here are the
kernel's own, from writing to /dev/full; the CPU allocator's refusal is torch's own."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

import pytest
import torch

from bayesavg.runtime import io, launch
from bayesavg.runtime.entry import Terminated, run_entry, said_of
from bayesavg.runtime.errors import (
    EXIT_USER_ERROR,
    UserError,
    as_user_error,
    disk_full,
    out_of_memory,
)

_REAL_SAVE = torch.save


def _fill_dev_full() -> None:
    """Write where the kernel answers ENOSPC."""
    with open("/dev/full", "wb") as f:
        f.write(b"x" * 10)
        f.flush()


def _torch_save_on_full_disk(obj: object, f: object) -> None:
    """torch.save as it runs on a full disk: the real one, writing to /dev/full through a
    buffer, as to a file (its error then is the one a full tmpfs gave)."""
    full = open("/dev/full", "wb")  # noqa: SIM115 (closing it raises ENOSPC again)
    try:
        _REAL_SAVE(obj, full)
    finally:
        with contextlib.suppress(OSError):
            full.close()


def _torch_error() -> RuntimeError:
    with pytest.raises(RuntimeError) as caught:
        _torch_save_on_full_disk({"w": torch.zeros(4096)}, None)
    return caught.value


def test_the_no_space_error_is_found_behind_torch_s_own() -> None:
    err = _torch_error()
    assert "No space" not in str(err), "torch's message does not say it: the cause does"
    found = disk_full(err)
    assert isinstance(found, OSError) and found.errno == errno.ENOSPC


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_or_quota_is_a_user_error(code: int) -> None:
    user = as_user_error(OSError(code, os.strerror(code), "models/x/posterior.pt"))
    assert isinstance(user, UserError)
    assert str(user).startswith("no space left on the device writing models/x/posterior.pt (")


@pytest.mark.parametrize(
    "err",
    [
        OSError(errno.EACCES, "Permission denied"),
        RuntimeError("unexpected pos 10 vs 8"),
        ValueError("a bug"),
    ],
    ids=["other-oserror", "torch-without-cause", "bug"],
)
def test_other_errors_stay_bugs(err: BaseException) -> None:
    assert disk_full(err) is None and as_user_error(err) is None


def test_a_cycle_of_contexts_ends_the_search() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert disk_full(a) is None


def test_an_atomic_write_on_a_full_disk_names_the_file_and_leaves_the_old_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.json"
    path.write_text("old")
    with pytest.raises(UserError) as caught, io.atomic_path(path):
        _fill_dev_full()
    said = str(caught.value)
    assert said.startswith(f"no space left on the device writing {path} ("), "outside: whole"
    assert " free there): free some and run it again" in said
    assert disk_full(caught.value) is not None, "the kernel's error is kept as the cause"
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_a_relative_path_is_named_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    said = r"^no space left on the device writing runs/a\.json \("
    with pytest.raises(UserError, match=said), io.atomic_path("runs/a.json"):
        _fill_dev_full()
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_checkpoint_on_a_full_disk_is_a_user_error_and_leaves_the_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case seen on a 300 MB tmpfs: a fine-tuning checkpoint's save. The previous
    checkpoint stays whole, so the stage resumes from it once there is room."""
    path = tmp_path / "checkpoints" / "finetune@swag.pt"
    io.save_torch(path, {"epoch": 3})
    before = path.read_bytes()
    monkeypatch.setattr(torch, "save", _torch_save_on_full_disk)
    with pytest.raises(UserError, match=r"^no space left on the device writing .*finetune@swag"):
        io.save_torch(path, {"epoch": 4, "w": torch.zeros(4096)})
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["finetune@swag.pt"]


def test_an_entry_point_ends_with_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def stage() -> None:
        raise _torch_error()

    with pytest.raises(SystemExit) as stop:
        run_entry(stage)
    assert stop.value.code == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: {said_of(_torch_error())}"]
    assert err.startswith("error: no space left on the device: free some and run it again")


def test_an_entry_point_keeps_a_bug_s_traceback() -> None:
    def stage() -> None:
        raise RuntimeError("unexpected pos 10 vs 8")

    with pytest.raises(RuntimeError, match="unexpected pos"):
        run_entry(stage)


def test_a_rank_records_a_full_disk_as_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written through ``atomic_path`` or not (a dataset download, torch's own file): the
    launcher then prints the rank's line without its traceback."""
    monkeypatch.setenv(launch.RANK_ERRORS_ENV, str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "2")

    def atomic() -> None:
        with io.atomic_path(tmp_path / "out" / "metrics.json"):
            _fill_dev_full()

    def torch_s_own() -> None:
        raise _torch_error()

    for rank, work in enumerate((atomic, torch_s_own)):
        monkeypatch.setenv("RANK", str(rank))
        assert launch.rank_entry(work) == EXIT_USER_ERROR
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["user_error"] is True
        assert record["message"].startswith("no space left on the device")
        assert record["message"] == said_of(_torch_error()) or rank == 0


@pytest.mark.parametrize(
    ("err", "said"),
    [
        (UserError("lr: must be > 0"), "lr: must be > 0"),
        (KeyError("k"), "KeyError: 'k'"),
        (ValueError("first line\nsecond line"), "ValueError: first line"),
        (ValueError(), "ValueError: "),
        (KeyboardInterrupt(), "interrupted by Ctrl-C (SIGINT): stopped; run it again"),
        (Terminated(), "interrupted by SIGTERM: stopped; run it again"),
    ],
)
def test_said_of_is_the_line_the_entry_point_ends_with(err: BaseException, said: str) -> None:
    assert said_of(err).startswith(said)
    assert "\n" not in said_of(err)


def test_said_of_keeps_a_long_message_short() -> None:
    assert len(said_of(ValueError("x" * 10_000))) == 500


def _cpu_allocator_refusal() -> RuntimeError:
    with pytest.raises(RuntimeError) as caught:
        torch.empty(2**62, dtype=torch.uint8)
    return caught.value


ADVICE = (
    "lower the stage's batch_size in params.yaml (pretrain, finetune.<name> or evaluate), "
    "or on CUDA train with precision: bf16"
)


def test_a_batch_too_large_for_the_cpu_is_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    refusal = _cpu_allocator_refusal()

    def stage() -> None:
        raise refusal

    with pytest.raises(SystemExit) as stop:
        run_entry(stage)
    assert stop.value.code == EXIT_USER_ERROR
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: out of memory ([enforce fail at ")
    assert "DefaultCPUAllocator: can't allocate memory: you tried to allocate" in line
    assert line.endswith(f"): {ADVICE}")


@pytest.mark.parametrize(
    ("err", "said"),
    [
        (
            torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"
                " of 79.19 GiB of which 1.06 GiB is free.\nSee the documentation"
            ),
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"
            " of 79.19 GiB of which 1.06 GiB is free.",
        ),
        (MemoryError(), "MemoryError"),
        (MemoryError("  "), "MemoryError"),
    ],
    ids=["cuda", "python", "python-blank"],
)
def test_out_of_memory_says_torch_s_first_line_and_what_to_change(
    err: BaseException, said: str
) -> None:
    assert str(as_user_error(err)) == f"out of memory ({said}): {ADVICE}"


def test_out_of_memory_is_found_behind_another_error() -> None:
    try:
        try:
            raise _cpu_allocator_refusal()
        except RuntimeError as oom:
            raise ValueError("while building the batch") from oom
    except ValueError as err:
        assert out_of_memory(err) is not None
        assert str(as_user_error(err)).startswith("out of memory ([enforce fail at ")


def test_a_full_disk_is_said_before_memory() -> None:
    """Both behind one error (a save that failed while memory ran out): the disk's line,
    which names the file."""
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "a.pt")
    full.__context__ = MemoryError()
    assert str(as_user_error(full)).startswith("no space left on the device writing a.pt")


def test_other_runtime_errors_are_not_out_of_memory() -> None:
    assert out_of_memory(RuntimeError("CUDA error: an illegal memory access")) is None
