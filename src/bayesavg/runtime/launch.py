"""Run a command on N processes with torchrun, or in this one process when N is 1.

N comes from ``BAYESAVG_NPROC`` (default 1), never from params: the DVC
stage's command and its results do not depend on it. ``relaunch`` runs
torchrun itself (``torch.distributed.run``, as the ``torchrun`` script does)
in standalone mode, which picks a free port, so two runs on one machine do
not collide. Importing this module does not import torch (every stage
imports it). A rank's failure is recorded by that rank (``rank_entry``) with
its time, and the launcher reports the first one as one line, plus the
traceback when it is a bug rather than a user error: the other ranks' errors
(a peer that vanished) and torchrun's own report are consequences. For
several nodes, run ``torchrun`` by hand on each (README).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence

from . import numerics
from .entry import (
    RANK_ERRORS_ENV,
    STOPS,
    Terminated,
    exit_code,
    said_of,
    setup_logging,
    stop_once,
)
from .errors import UserError, as_user_error, resumes_from, resuming

NPROC_ENV = "BAYESAVG_NPROC"


def nproc() -> int:
    """Processes to run distributed stages on (``BAYESAVG_NPROC``, default 1)."""
    text = os.environ.get(NPROC_ENV, "1")
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise UserError(f"{NPROC_ENV}: must be a positive integer (got {text!r})")
    return int(text)


def is_rank() -> bool:
    """Whether this process is one rank of a torchrun job."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def is_main_rank() -> bool:
    """Rank 0, or a process outside any torchrun job: the one that writes outputs."""
    return os.environ.get("RANK", "0") == "0"


def should_relaunch() -> bool:
    return not is_rank() and nproc() > 1


def relaunch(argv: Sequence[str]) -> None:
    """Run ``python argv...`` on ``BAYESAVG_NPROC`` processes through torchrun; return when
    all have finished, or raise ``UserError`` with the first failure in one line."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    errors = tempfile.mkdtemp(prefix="bayesavg-ranks-")
    os.environ[RANK_ERRORS_ENV] = errors
    # The ranks are new processes that inherit the environment: the thread count and
    # instruction set apply to them even where this process imported torch unpinned.
    numerics.pin(os.environ)
    crowded = numerics.oversubscribed(nproc())
    if crowded is not None:
        logging.getLogger(__name__).warning(crowded)
    # torchrun's own account of a failure ("failed (exitcode: 2) local_rank: 1 ...") is a
    # consequence of the rank's error, which is reported instead. Its loggers set their
    # own levels, so each is silenced, not just the parent.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    # torchrun's per-attempt folders go inside the errors folder, which is removed at the
    # end: left to itself it makes a ``torchelastic_*`` folder in $TMPDIR on every run and
    # never removes it.
    logs = os.path.join(errors, "torchrun")
    flags = ["--standalone", f"--nproc-per-node={nproc()}", "--max-restarts=0"]
    args = get_args_parser().parse_args([*flags, "--log-dir", logs, *argv])
    try:
        run(args)
    except ChildFailedError:
        raise UserError(_first_failure(errors)) from None
    except SignalException as stop:
        # Ctrl-C or SIGTERM here: torchrun has passed it on to the ranks and waited for
        # them. The stop is said as a single process's is, with rank 0's checkpoint.
        resumes_from(next((r["resume"] for r in _records(errors) if r.get("resume")), None))
        raise (KeyboardInterrupt() if stop.sigval == signal.SIGINT else Terminated()) from None
    finally:
        shutil.rmtree(errors, ignore_errors=True)


def _records(errors: str) -> list[dict[str, object]]:
    """What the ranks recorded of how they stopped, rank 0 first."""
    records = []
    for name in os.listdir(errors):
        if not (name.startswith("rank") and name.endswith(".json")):
            continue  # torchrun's logs
        with open(os.path.join(errors, name)) as f:
            records.append(json.load(f))
    return sorted(records, key=lambda r: r["rank"])


def _first_failure(errors: str) -> str:
    """The earliest failure a rank recorded, as one line (the traceback first if a bug)."""
    records = _records(errors)
    if not records:
        return f"a rank of the {nproc()}-process run died without a word (killed?)"
    first = min(records, key=lambda r: r["time"])
    if not first["user_error"]:
        sys.stderr.write(first["traceback"])
    return f"rank {first['rank']} of {first['world']}: {first['message']}"


def rank_entry(fn: Callable[[], None]) -> int:
    """Run one rank's part; on failure record it for the launcher and return the exit code.

    Nothing is printed: the launcher reports the first failure of the job, or, stopped
    itself, the checkpoint rank 0 recorded here. Ranks other than 0 log warnings only.
    """
    setup_logging()
    if not is_main_rank():
        logging.getLogger().setLevel(logging.WARNING)
    for signum in STOPS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, stop_once)
    try:
        fn()
    except BaseException as err:
        _part_over()
        stopped = isinstance(err, KeyboardInterrupt)
        said = said_of(err) if stopped else as_user_error(err)
        user = said is not None
        record = {
            "rank": int(os.environ.get("RANK", "0")),
            "world": int(os.environ.get("WORLD_SIZE", "1")),
            "time": time.time(),
            "user_error": user,
            "message": str(said) if user else f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc(),
            "resume": resuming(),
        }
        folder = os.environ.get(RANK_ERRORS_ENV)
        if folder is None:  # a rank started by hand, not by relaunch: say it here
            line = f"{said}\n" if stopped else f"error: {said}\n"
            sys.stderr.write(line if user else record["traceback"])
        else:
            with open(os.path.join(folder, f"rank{record['rank']}.json"), "w") as f:
                json.dump(record, f)
        if stopped:
            return exit_code(err)
        return 2 if user else 1
    _part_over()
    return 0


def _part_over() -> None:
    """From here a stop is ignored: the rank's part is over, and torchrun's SIGTERM to the
    job's other ranks when one failed (or a late second Ctrl-C) would only cut its exit
    short with a traceback ("Exception ignored in atexit callback ... Terminated"). Rank 0
    of a finished stage then waits for its tracking worker as one process does
    (``leave_on_stop``)."""
    for signum in STOPS:
        signal.signal(signum, signal.SIG_IGN)
