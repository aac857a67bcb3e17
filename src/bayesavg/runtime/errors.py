"""The one exception type for mistakes a user can fix (bad params, missing data, a full
disk, a batch too large for the memory, ...).

Entry points turn it into a single line on stderr and exit code 2; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator

EXIT_USER_ERROR = 2
_FULL = (errno.ENOSPC, errno.EDQUOT)
_REFUSED = (errno.EACCES, errno.EPERM, errno.EROFS)
_CPU_ALLOC = "DefaultCPUAllocator: can't allocate memory"


class UserError(Exception):
    """A problem the user can fix; the message says what and how."""


class _Resume:
    """The checkpoint a rerun of this process's stage would resume from: the one it last
    saved or resumed from (``runtime.checkpoint``), None once removed or before any."""

    path: str | None = None


def resumes_from(path: str | os.PathLike[str] | None) -> None:
    """Record ``path`` as what running the stage again resumes from (None: nothing)."""
    _Resume.path = None if path is None else os.fspath(path)


def resuming() -> str | None:
    """The checkpoint this process would resume from (``resumes_from``), or None: a rank
    hands it to its launcher, which then names it."""
    return _Resume.path


def rerun() -> str:
    """How the line a stopped stage ends with says to go on: from the checkpoint this
    process saved, where there is one; else what a rerun of each kind of stage does."""
    if _Resume.path is not None:
        return f"run it again to resume from {_shown(_Resume.path)}"
    return "run it again (pretrain and fine-tuning stages resume from their last checkpoint)"


def _chain(err: BaseException | None) -> Iterator[BaseException]:
    """``err`` and its causes and contexts, each once."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def disk_full(err: BaseException | None) -> OSError | None:
    """The "no space left" or "quota exceeded" OSError behind ``err``, through its causes
    and contexts (torch reports a full disk as a RuntimeError raised while handling it)."""
    for found in _chain(err):
        if isinstance(found, OSError) and found.errno in _FULL:
            return found
    return None


def out_of_memory(err: BaseException | None) -> BaseException | None:
    """The allocation failure behind ``err``: torch's ``OutOfMemoryError`` (CUDA, MPS),
    its CPU allocator's refusal (a RuntimeError) or Python's ``MemoryError``. Matched by
    name and message: this module does not import torch."""
    for found in _chain(err):
        names = {c.__name__ for c in type(found).__mro__}
        if names & {"OutOfMemoryError", "MemoryError"} or _CPU_ALLOC in str(found):
            return found
    return None


def refused(err: BaseException | None) -> OSError | None:
    """The "permission denied" or "read-only file system" OSError on a named file behind
    ``err``, through its causes and contexts."""
    for found in _chain(err):
        if isinstance(found, OSError) and found.errno in _REFUSED and found.filename:
            return found
    return None


def no_space(path: str | os.PathLike[str] | None) -> UserError:
    """The one line a full disk ends with: where, how much is left, what to do."""
    where = ""
    if path is not None:
        free = _free(os.fspath(path))
        where = f" writing {_shown(path)}" + (f" ({free} free there)" if free else "")
    return UserError(f"no space left on the device{where}: free some and {rerun()}")


def not_writable(path: str | os.PathLike[str], found: OSError) -> UserError:
    """The one line an output that cannot be written ends with (a read-only folder or
    disk): which file, the system's reason, what to do."""
    return UserError(
        f"cannot write {_shown(path)} ({_reason(found)}): make its folder writable, then {rerun()}"
    )


def as_user_error(err: BaseException) -> UserError | None:
    """``err`` as the UserError an entry point reports, or None for a bug."""
    if isinstance(err, UserError):
        return err
    full = disk_full(err)
    if full is not None:
        return no_space(full.filename)
    denied = refused(err)
    if denied is not None:
        return UserError(
            f"cannot use {_shown(denied.filename)} ({_reason(denied)}): check its "
            f"permissions and the disk it is on, then {rerun()}"
        )
    memory = out_of_memory(err)
    if memory is None:
        return None
    said = (str(memory).splitlines() or [""])[0].strip() or type(memory).__name__
    return UserError(
        f"out of memory ({said}): lower the stage's batch_size in params.yaml (pretrain, "
        "finetune.<name> or evaluate), or on CUDA train with precision: bf16"
    )


def _shown(path: str | bytes | os.PathLike[str]) -> str:
    """``path`` as a user reads it: relative to where they ran the command, if inside."""
    path = os.fsdecode(path)
    shown = os.path.relpath(path) if os.path.isabs(path) else path
    return path if shown.startswith(os.pardir) else shown


def _reason(found: OSError) -> str:
    return (found.strerror or errno.errorcode.get(found.errno or 0, "refused")).lower()


def _free(path: str) -> str | None:
    folder = path
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        free = shutil.disk_usage(folder or ".").free
    except OSError:
        return None
    return f"{free / 2**20:.1f} MiB" if free < 2**30 else f"{free / 2**30:.1f} GiB"
