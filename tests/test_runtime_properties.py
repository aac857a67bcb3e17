"""Properties of the runtime helpers that a mutation audit found no test pinning down:
the atomic writers' exact output and permissions, the stale-temporary sweep's limits, the
checkpoint's resume rules, the numerics and entry-point settings, the torch version check.

Each test asserts a documented contract (the module's docstring, DESIGN.md); all run in
process and in well under a second each.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bayesavg.runtime import entry, io, numerics
from bayesavg.runtime import torch_version as tv
from bayesavg.runtime.checkpoint import FORMAT, Checkpoint
from bayesavg.runtime.errors import UserError
from bayesavg.runtime.outputs import all_or_nothing, finish_killed


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- io ------------------------------------------------------------------------------------


def test_atomic_outputs_are_ordinary_files_not_mkstemps_private_ones(tmp_path: Path) -> None:
    """mkstemp makes 0600; an output is as readable as any file the user writes."""
    target = tmp_path / "metrics.json"
    io.write_json(target, {"a": 1})
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_write_json_is_sorted_indented_and_ends_with_a_newline(tmp_path: Path) -> None:
    """The same content gives the same bytes whatever the dict's order (DVC hashes them)."""
    target = tmp_path / "m.json"
    io.write_json(target, {"b": 1, "a": {"y": 2, "x": 3}})
    assert target.read_text() == '{\n  "a": {\n    "x": 3,\n    "y": 2\n  },\n  "b": 1\n}\n'


def test_write_csv_columns_are_every_rows_keys_in_first_seen_order(tmp_path: Path) -> None:
    """A row without a column (an epoch without a monitoring point) has an empty cell."""
    target = tmp_path / "history.csv"
    rows = [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "test": 0.25, "loss": 0.1}, {"epoch": 3}]
    io.write_csv(target, rows)
    assert target.read_text() == "epoch,loss,test\n1,0.5,\n2,0.1,0.25\n3,,\n"


def test_write_csv_writes_a_numpy_float_as_a_number(tmp_path: Path) -> None:
    """A numpy float64 is a ``float``, and numpy 2's repr of it is ``np.float64(0.5)``: a
    string to DVC plots, pandas and the report's CSV reader."""
    target = tmp_path / "rows.csv"
    io.write_csv(target, [{"epoch": 1, "loss": np.float64(0.5), "acc": np.float64(1 / 3)}])
    assert target.read_text() == f"epoch,loss,acc\n1,0.5,{1 / 3!r}\n"


def test_write_csv_of_no_rows_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "empty.csv"
    with pytest.raises(ValueError, match="no rows"):
        io.write_csv(target, [])
    assert list(tmp_path.iterdir()) == []


def test_torch_damage_names_a_file_that_is_no_zip_archive(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.pt"
    target.write_bytes(b"not a torch archive at all")
    found = io.torch_damage(target)
    assert found is not None and found.startswith("not a readable zip archive")


def test_write_npz_members_carry_a_fixed_timestamp(tmp_path: Path) -> None:
    """numpy.savez stamps the current time; reruns an hour apart must give the same bytes."""
    import numpy as np

    target = tmp_path / "a.npz"
    io.write_npz(target, {"x": np.arange(3)})
    with zipfile.ZipFile(target) as archive:
        assert [i.date_time for i in archive.infolist()] == [(1980, 1, 1, 0, 0, 0)]


def test_the_sweep_leaves_a_symlink_named_like_a_temporary(tmp_path: Path) -> None:
    """Only this path's own temp files go, never a link (which may point anywhere)."""
    path = tmp_path / "ckpt.pt"
    elsewhere = tmp_path / "keep.bin"
    elsewhere.write_bytes(b"keep")
    link = tmp_path / ".ckpt.pt.abcd1234.tmp"
    link.symlink_to(elsewhere)
    stale = tmp_path / ".ckpt.pt.wxyz6789.tmp"
    stale.write_bytes(b"12345")
    assert io.remove_stale_temporaries(path) == [(stale, 5)]
    assert link.is_symlink() and elsewhere.read_bytes() == b"keep"


# --- outputs -------------------------------------------------------------------------------


def _aside(path: Path, random: str, content: str | None, mtime_ns: int) -> Path:
    """An ``all_or_nothing`` aside folder that a killed run left: ``.<name>.<random>.old``
    holding ``content`` under the path's name (None: killed before the move)."""
    aside = path.parent / f".{path.name}.{random}.old"
    aside.mkdir()
    if content is not None:
        (aside / path.name).write_text(content)
    os.utime(aside, ns=(mtime_ns, mtime_ns))
    return aside


def test_finish_killed_puts_back_the_oldest_asides_content(tmp_path: Path) -> None:
    """Of several killed runs' asides the oldest holds what was there first; the later
    ones hold killed bodies' writes and go."""
    path = tmp_path / "metrics.json"
    path.write_text("the last killed body's")
    _aside(path, "bbbbbbbb", "a killed body's", 2_000_000_000_000_000_000)
    _aside(path, "aaaaaaaa", "the original", 1_000_000_000_000_000_000)
    finish_killed([path])
    assert path.read_text() == "the original"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_finish_killed_skips_an_aside_killed_before_its_move(tmp_path: Path) -> None:
    """An empty aside (killed between making it and moving the path in) holds nothing to
    put back; the next one does."""
    path = tmp_path / "metrics.json"
    path.write_text("a killed body's")
    _aside(path, "aaaaaaaa", None, 1_000_000_000_000_000_000)
    _aside(path, "bbbbbbbb", "the original", 2_000_000_000_000_000_000)
    finish_killed([path])
    assert path.read_text() == "the original"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def test_a_listed_file_inside_a_listed_folder_survives_a_killed_run(tmp_path: Path) -> None:
    """The inner path is covered by the folder whatever the order they are listed in: a
    SIGKILLed run and a failing one after it leave the folder as it was, its file in place."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "x.json").write_text("old\n")
    before = _tree(tmp_path)
    listed = [folder / "x.json", folder]
    pid = os.fork()
    if pid == 0:  # the child: writes inside the set, then dies without a roll-back
        try:
            with all_or_nothing(listed):
                folder.mkdir(exist_ok=True)
                (folder / "x.json").write_text("killed\n")
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)  # never back into pytest
    os.waitpid(pid, 0)
    with pytest.raises(RuntimeError), all_or_nothing(listed):
        folder.mkdir(exist_ok=True)
        (folder / "x.json").write_text("failed\n")
        raise RuntimeError
    assert _tree(tmp_path) == before


def test_relative_paths_are_rolled_back_where_they_were_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The paths are fixed when the set opens: a body that changes the working folder
    still has its writes removed and the old contents put back in the right place."""
    (tmp_path / "stage").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "stage")
    Path("metrics.json").write_text("old\n")
    with pytest.raises(RuntimeError), all_or_nothing(["metrics.json"]):
        Path("metrics.json").write_text("new\n")
        os.chdir(tmp_path / "elsewhere")
        raise RuntimeError
    assert _tree(tmp_path) == {
        "elsewhere": None,
        "stage": None,
        "stage/metrics.json": b"old\n",
    }


def test_a_body_that_wrote_a_link_to_a_folder_is_rolled_back_without_following_it(
    tmp_path: Path,
) -> None:
    """What the body wrote goes, a link as a link: the folder it points to is not the
    body's and stays whole."""
    target = tmp_path / "shared_data"
    target.mkdir()
    (target / "keep.csv").write_text("keep\n")
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), all_or_nothing([out]):
        out.symlink_to(target, target_is_directory=True)
        raise RuntimeError
    assert not os.path.lexists(out)
    assert (target / "keep.csv").read_text() == "keep\n"


# --- checkpoint ----------------------------------------------------------------------------


def test_a_torch_file_without_the_checkpoint_format_is_not_resumed(tmp_path: Path) -> None:
    """Even with the right key: only a file ``Checkpoint.save`` wrote is a checkpoint."""
    path = tmp_path / "ckpt.pt"
    torch.save({"key": "k", "meta": {}, "state": {"epoch": 3}}, path)
    assert Checkpoint(path, key="k").load() is None
    assert not path.exists()


RAN: list[str] = []


def _record(what: str) -> str:
    RAN.append(what)
    return what


class _Payload:
    """Pickles as a call of ``_record``: code that a loader without weights_only runs."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _record, ("code ran while loading",)


def test_a_checkpoint_holding_code_is_refused_without_running_it(tmp_path: Path) -> None:
    """Loading uses weights_only=True: tensors and plain values only, never code."""
    path = tmp_path / "ckpt.pt"
    tree = {"format": FORMAT, "key": "k", "meta": {}, "state": {"payload": _Payload()}}
    torch.save(tree, path)
    RAN.clear()
    assert Checkpoint(path, key="k").load() is None
    assert RAN == [] and not path.exists()


def test_a_zip_that_torch_cannot_read_is_deleted(tmp_path: Path) -> None:
    """Intact CRC-32s but no torch archive: unreadable, so it goes and the run starts afresh."""
    path = tmp_path / "ckpt.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "not a checkpoint")
    assert io.torch_damage(path) is None
    checkpoint = Checkpoint(path, key="k")
    assert checkpoint.load() is None and checkpoint.state is None
    assert not path.exists()


def test_load_forgets_the_state_of_an_earlier_load(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    checkpoint = Checkpoint(path, key="k")
    checkpoint.save({"epoch": 2})
    assert checkpoint.load() == {"epoch": 2}
    checkpoint.remove()
    assert checkpoint.load() is None and checkpoint.state is None


@pytest.mark.parametrize(("every", "due"), [(0, []), (1, [1, 2, 3, 4, 5, 6]), (3, [3, 6])])
def test_a_checkpoint_is_due_every_every_epochs_and_never_at_0(
    tmp_path: Path, every: int, due: list[int]
) -> None:
    checkpoint = Checkpoint(tmp_path / "ckpt.pt", key="k", every=every)
    assert [epoch for epoch in range(1, 7) if checkpoint.due(epoch)] == due
    assert checkpoint.active == (every > 0)


def test_a_nested_run_saves_through_its_wrap_and_follows_its_parent(tmp_path: Path) -> None:
    """An ensemble member's state is saved inside the larger run's; with checkpoints off
    (every 0) the member is not active either."""
    path = tmp_path / "ckpt.pt"
    outer = Checkpoint(path, key="k")
    member = outer.nested(None, lambda state: {"finished": [1], "member": state})
    assert member.active and member.state is None
    member.save({"epoch": 1})
    assert Checkpoint(path, key="k").load() == {"finished": [1], "member": {"epoch": 1}}
    off = Checkpoint(tmp_path / "off.pt", key="k", every=0).nested({"epoch": 1}, dict)
    assert not off.active and not off.due(1)


# --- numerics ------------------------------------------------------------------------------


def test_a_world_size_of_0_or_garbage_counts_as_one_process() -> None:
    for value in ("0", "", "two"):
        assert numerics.world_size({"WORLD_SIZE": value}) == 1
        assert numerics.threads({"WORLD_SIZE": value}) == numerics.DEFAULT_THREADS


def test_the_pinned_path_needs_an_x86_64_cpu_with_avx2_and_fma() -> None:
    """However the platform spells the architecture (Windows: AMD64)."""
    assert numerics.can_pin("AMD64", frozenset({"avx2", "fma"}))
    assert not numerics.can_pin("x86_64", frozenset({"avx", "avx2"}))


def test_oversubscription_counts_the_cores_this_process_may_use_not_the_machines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A container's cpuset (the affinity mask) limits the cores, not os.cpu_count()."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert numerics.usable_cores() == 1
    found = numerics.oversubscribed(2, {})
    assert found is not None and found.startswith("2 processes x 1 threads on 1 usable cores")


def test_portable_mode_pins_every_library_to_avx2(monkeypatch: pytest.MonkeyPatch) -> None:
    """ATen, oneDNN and MKL alike: one library left free would pick AVX-512 kernels on a
    CPU that has them, and the bytes would follow the machine again."""
    monkeypatch.setattr(numerics, "can_pin", lambda *args: True)
    env: dict[str, str] = {}
    numerics.pin(env)
    pins = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "MKL_DYNAMIC")
    assert [env[k] for k in pins] == ["avx2", "AVX2", "COMPATIBLE", "FALSE"]


def test_pin_of_a_given_environment_works_after_torch_is_imported() -> None:
    """Only the process's own environment is refused once torch is loaded: a rank's or a
    subprocess's environment is still built with ``pin``."""
    env = {numerics.THREADS_ENV: "3"}
    assert numerics.pin(env)["OMP_NUM_THREADS"] == "3"


# --- entry ---------------------------------------------------------------------------------


def test_a_user_error_is_one_line_on_stderr_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    def stage() -> None:
        raise UserError("data/prepared is missing; run `dvc repro prepare`")

    with pytest.raises(SystemExit) as stop:
        entry.run_entry(stage)
    assert stop.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "error: data/prepared is missing; run `dvc repro prepare`\n"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_an_interruption_is_said_on_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    def stage() -> None:
        raise entry.Terminated

    with pytest.raises(SystemExit) as stop:
        entry.run_entry(stage)
    assert stop.value.code == 143
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("interrupted by SIGTERM: stopped;")


def test_once_the_entry_runs_ctrl_c_raises_and_the_early_handler_is_back_after(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """During the body Ctrl-C is Python's KeyboardInterrupt (``finally`` blocks run);
    afterwards the handlers are the ones the entry found."""
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    during: list[Any] = []
    try:
        signal.signal(signal.SIGINT, entry._early)
        entry.run_entry(lambda: during.append(signal.getsignal(signal.SIGINT)))
        assert during == [signal.default_int_handler]
        assert signal.getsignal(signal.SIGINT) is entry._early
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])


def test_an_entry_logs_info_lines_to_stderr() -> None:
    """A fresh process: pytest's own log handlers would hide a missing set-up."""
    code = (
        "import logging\n"
        "from bayesavg.runtime.entry import run_entry\n"
        "run_entry(lambda: logging.getLogger('bayesavg.stage').info('collected 5'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "INFO bayesavg.stage: collected 5\n"


def test_early_interrupts_leave_a_signal_ignored_from_the_start_ignored() -> None:
    """``nohup``: an ignored SIGINT stays ignored; SIGTERM gets the early handler."""
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        entry.early_interrupts()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is entry._early
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])


# --- torch_version ---------------------------------------------------------------------------


def _package(root: Path, name: str, version_py: str | None) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("raise ImportError('never imported')\n")
    if version_py is not None:
        (root / name / "version.py").write_text(version_py)


def test_importable_version_reads_version_py_without_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package(tmp_path, "fake_torch_a", "__version__ = '2.11.0a0+git5f3e'\ncuda = None\n")
    _package(tmp_path, "fake_torch_b", "# __version__ = '9.9'\nversion = '1.0'\n")
    _package(tmp_path, "fake_torch_c", None)
    (tmp_path / "fake_torch_d.py").write_text("__version__ = '1.0'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {n: tv.importable_version(f"fake_torch_{n}") for n in "abcd"}
    assert found == {"a": "2.11.0a0+git5f3e", "b": None, "c": None, "d": None}
    assert tv.importable_version("no_such_package_here") is None


def test_a_version_that_is_no_release_number_is_said_so() -> None:
    found = tv.problem({"torch": "nightly", "torchvision": "0.26.0"})
    assert found is not None
    assert found.startswith("torch has version 'nightly', which is not a release number;")


def test_the_importable_check_lets_a_newer_torch_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the set-up refuses a release newer than the newest tested; a stage runs on it."""
    newer = {"torch": "2.15.0", "torchvision": "0.30.0"}
    monkeypatch.setattr(tv, "importable_version", newer.get)
    assert tv.check_importable() is None
