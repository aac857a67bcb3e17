"""The one exception type for mistakes a user can fix (bad params, missing data, a full
disk, ...).

Entry points turn it into a single line on stderr and exit code 2; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import shutil

EXIT_USER_ERROR = 2
_FULL = (errno.ENOSPC, errno.EDQUOT)


class UserError(Exception):
    """A problem the user can fix; the message says what and how."""


def disk_full(err: BaseException | None) -> OSError | None:
    """The "no space left" or "quota exceeded" OSError behind ``err``, through its causes
    and contexts (torch reports a full disk as a RuntimeError raised while handling it)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _FULL:
            return err
        err = err.__cause__ or err.__context__
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
    return None if full is None else no_space(full.filename)


def _free(path: str) -> str | None:
    folder = path
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        free = shutil.disk_usage(folder or ".").free
    except OSError:
        return None
    return f"{free / 2**20:.1f} MiB" if free < 2**30 else f"{free / 2**30:.1f} GiB"
