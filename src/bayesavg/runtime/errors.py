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
_CPU_ALLOC = "DefaultCPUAllocator: can't allocate memory"


class UserError(Exception):
    """A problem the user can fix; the message says what and how."""


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


def no_space(path: str | os.PathLike[str] | None) -> UserError:
    """The one line a full disk ends with: where, how much is left, what to do."""
    where = ""
    if path is not None:
        free = _free(os.fspath(path))
        shown = os.path.relpath(path) if os.path.isabs(path) else os.fspath(path)
        where = f" writing {shown}" + (f" ({free} free there)" if free else "")
    return UserError(
        f"no space left on the device{where}: free some and run it again (a fine-tuning "
        "stage resumes from its last checkpoint)"
    )


def as_user_error(err: BaseException) -> UserError | None:
    """``err`` as the UserError an entry point reports, or None for a bug."""
    if isinstance(err, UserError):
        return err
    full = disk_full(err)
    if full is not None:
        return no_space(full.filename)
    memory = out_of_memory(err)
    if memory is None:
        return None
    said = (str(memory).splitlines() or [""])[0].strip() or type(memory).__name__
    return UserError(
        f"out of memory ({said}): lower the stage's batch_size in params.yaml (pretrain, "
        "finetune.<name> or evaluate), or on CUDA train with precision: bf16"
    )


def _free(path: str) -> str | None:
    folder = path
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        free = shutil.disk_usage(folder or ".").free
    except OSError:
        return None
    return f"{free / 2**20:.1f} MiB" if free < 2**30 else f"{free / 2**30:.1f} GiB"
