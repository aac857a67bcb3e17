"""A checkpoint resumes only with the bytes it was saved with; its writes survive a
power loss; a killed save's temporaries do not pile up beside it."""

from __future__ import annotations

import logging
import os
import stat
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.serialization import config

from bayesavg.runtime import io
from bayesavg.runtime.checkpoint import Checkpoint
from bayesavg.runtime.errors import UserError

LOGGER = "bayesavg.runtime.checkpoint"


def _state(big: int) -> dict[str, Any]:
    """A tree shaped like a trajectory's: weights, optimizer, RNG, history, odd tensors."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(big, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(3, big)).sum().backward()
    opt.step()
    base = torch.arange(12.0)
    return {
        "parts": {"net": net.state_dict(), "optimizer": opt.state_dict()},
        "rng": [torch.get_rng_state()],
        "empty": torch.empty(0),
        "view": base[::3],
        "shared": [base, base[2:5]],
        "progress": {"epoch": 4, "iteration": 40},
        "history": [{"epoch": 1, "loss": 0.5}],
    }


def _data_span(path: Path, member: str) -> tuple[int, int]:
    """Where ``member``'s bytes lie in the archive: (offset, length)."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    with path.open("rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def _largest_record(path: Path) -> str:
    with zipfile.ZipFile(path) as archive:
        records = [i for i in archive.infolist() if "/data/" in i.filename]
    return max(records, key=lambda i: i.file_size).filename


def _flip(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b) and a.dtype == b.dtype
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# --- integrity ---------------------------------------------------------------------------


def test_checkpoint_with_a_flipped_tensor_byte_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "finetune@swag.pt"
    state = _state(big=4096)
    Checkpoint(path, key="k").save(state)
    intact = Checkpoint(path, key="k")
    assert _same(intact.load(), state)

    member = _largest_record(path)
    offset, length = _data_span(path, member)
    _flip(path, offset + length // 2)
    # torch itself does not notice: it would resume other weights
    damaged = torch.load(path, map_location="cpu", weights_only=True)
    assert not _same(damaged["state"], state)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        again = Checkpoint(path, key="k")
        assert again.load() is None
    assert again.state is None and not path.exists()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(path) in m and "CRC-32" in m and member in m for m in warned), warned


def test_checkpoint_with_a_damaged_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    Checkpoint(path, key="k").save(_state(big=64))
    with zipfile.ZipFile(path) as archive:
        first = archive.infolist()[0].header_offset
    _flip(path, first)  # the local header's signature
    assert Checkpoint(path, key="k").load() is None
    assert not path.exists()


# weights and momentum of 4 x big floats each: the last is a ~100 MB checkpoint
@pytest.mark.parametrize("big", [1, 64, 3_000_000], ids=["tiny", "small", "100MB"])
def test_checkpoints_as_written_pass_the_check_and_resume(tmp_path: Path, big: int) -> None:
    path = tmp_path / "ckpt.pt"
    state = _state(big)
    Checkpoint(path, key="k").save(state)
    again = Checkpoint(path, key="k")
    assert _same(again.load(), state)
    assert path.exists()


def test_checkpoint_written_with_torchs_crc_turned_off_still_resumes(tmp_path: Path) -> None:
    """``compute_crc32=False`` would write zero CRCs that the check refuses: saving pins it."""
    path = tmp_path / "ckpt.pt"
    state = _state(big=64)
    with config.patch({"save.compute_crc32": False}):
        Checkpoint(path, key="k").save(state)
    assert _same(Checkpoint(path, key="k").load(), state)


def test_a_posterior_with_a_flipped_tensor_byte_is_refused_in_one_line(tmp_path: Path) -> None:
    """torch would load it as other weights and evaluate them silently: the CRC-32s of
    the zip say the bytes are not those saved, and the evaluation stops (exit 2)."""
    from bayesavg.models import build_model
    from bayesavg.posteriors.file import PosteriorFile, load_posterior, save_posterior

    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 3)
    path = tmp_path / "posterior.pt"
    save_posterior(
        path,
        PosteriorFile.from_model(
            model,
            trajectory="sgd",
            model_name="mlp",
            model_kwargs={},
            input_shape=(1, 4, 4),
            mean=[0.5],
            std=[0.25],
            num_classes=3,
            data={"dataset": "mnist5k", "seed": 0, "test_fraction": 0.2, "val_fraction": 0.1},
        ),
    )
    intact = load_posterior(path)
    member = _largest_record(path)
    offset, length = _data_span(path, member)
    _flip(path, offset + length // 2)
    assert not torch.equal(torch.load(path, weights_only=True)["theta"], intact.theta), (
        "torch itself does not notice"
    )
    with pytest.raises(UserError) as refused:
        load_posterior(path)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message
    assert f"damaged (CRC-32 mismatch in {member})" in message


# --- atomic writes -------------------------------------------------------------------------


def _tmp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_atomic_path_fsyncs_the_file_before_the_rename_and_the_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out" / "result.json"
    events: list[tuple[str, ...]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            events.append(("fsync", "dir", str(st.st_ino)))
        else:  # with its size: the data is all written when it is flushed
            events.append(("fsync", "file", str(st.st_ino), str(st.st_size)))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append(("replace", str(os.stat(src).st_ino)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    io.write_json(target, {"a": 1})

    st = target.stat()
    assert events == [
        ("fsync", "file", str(st.st_ino), str(st.st_size)),
        ("replace", str(st.st_ino)),
        ("fsync", "dir", str(target.parent.stat().st_ino)),
    ]
    assert _tmp_files(target.parent) == []


def test_atomic_path_leaves_no_temporary_on_success_or_on_an_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    target = tmp_path / "x.txt"
    io.write_text(target, "old")
    assert _tmp_files(tmp_path) == [] and len(calls) == 2
    calls.clear()
    with pytest.raises(RuntimeError), io.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("stage failed")
    assert target.read_text() == "old" and _tmp_files(tmp_path) == [] and calls == []


# --- stale temporaries ---------------------------------------------------------------------

_KILLED_SAVE = """
import os, signal, sys
from bayesavg.runtime.io import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    tmp.write_bytes(b"half a checkpoint")
    print(tmp, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_save(path: Path) -> Path:
    """The temp file of a save SIGKILLed mid-write (no ``finally`` runs)."""
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_SAVE, str(path)], capture_output=True, text=True
    )
    assert proc.returncode == -9, proc.stderr
    tmp = Path(proc.stdout.strip())
    assert tmp.parent == path.parent and tmp.exists()
    return tmp


@pytest.mark.parametrize("saved", [True, False], ids=["beside-a-checkpoint", "first-save"])
def test_stale_temporaries_of_the_checkpoint_are_removed_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, saved: bool
) -> None:
    path = tmp_path / "finetune@swag.pt"
    if saved:
        Checkpoint(path, key="k").save({"x": torch.ones(2)})
    stale = [_killed_save(path), _killed_save(path)]
    others = [
        _killed_save(tmp_path / "finetune@swa.pt"),  # another stage's checkpoint
        _killed_save(tmp_path / "finetune@swag.pt.bak"),  # another file's
        tmp_path / ".finetune@swag.pt.abcd1234.tmp.keep",
        tmp_path / "finetune@swag.pt.abcd1234.tmp",
        tmp_path / ".finetune@swag.pt.notes.tmp",
        tmp_path / "notes.txt",
    ]
    for other in others:
        if not other.exists():
            other.write_text("keep me")
    lookalike_dir = tmp_path / ".finetune@swag.pt.dir12345.tmp"
    lookalike_dir.mkdir()

    with caplog.at_level(logging.INFO, logger=LOGGER):
        loaded = Checkpoint(path, key="k").load()

    assert (loaded is not None) == saved
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in others) and lookalike_dir.is_dir()
    assert path.exists() == saved
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "stale temp" in logged and all(p.name in logged for p in stale)
    assert not any(p.name in logged for p in others)


def test_nothing_is_logged_without_stale_temporaries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ckpt.pt"
    Checkpoint(path, key="k").save({"x": torch.ones(2)})
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert Checkpoint(path, key="k").load() is not None
    assert caplog.records == []
