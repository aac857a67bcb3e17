"""The error handling every entry point shares (the CLI and the DVC stages).

A ``UserError`` (or a full disk or memory, ``errors.as_user_error``) becomes one line
on stderr and exit code 2; an interruption (Ctrl-C,
or SIGTERM from a timeout, a cancelled job or ``kill``) one line and the shell's exit
code for that signal, 130 or 143; anything else is a bug and keeps its traceback. A
module of its own so that a stage importing it does not import the CLI (and with it the
whole evaluation code).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from .errors import EXIT_USER_ERROR, UserError, as_user_error, rerun

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a Ctrl-C
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143
RANK_ERRORS_ENV = "BAYESAVG_RANK_ERRORS"  # set by ``launch.relaunch`` for its ranks
STOPS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C; a timeout, a cancelled job, ``kill``


class Terminated(KeyboardInterrupt):
    """SIGTERM raised as Ctrl-C is: ``finally`` blocks, the atomic writes' clean-up and
    the tracked run's end (KILLED) happen, which the default SIGTERM (die at once) skips."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def stop_once(signum: int, frame: FrameType | None) -> None:
    """A torchrun rank's handler of Ctrl-C and SIGTERM: the first raises as ``run_entry``'s
    do, so ``finally`` blocks run; later ones are ignored. A rank gets each stop twice
    (from the terminal's process group and from torchrun, which passes its own on), and a
    second KeyboardInterrupt in the middle of the first one's clean-up would cut it short
    with a traceback. torchrun kills a rank that has not ended after its grace period."""
    for each in STOPS:
        signal.signal(each, signal.SIG_IGN)
    if signum == signal.SIGTERM:
        raise Terminated
    raise KeyboardInterrupt


def exit_code(err: KeyboardInterrupt) -> int:
    """The shell's exit code for an interruption: 143 (SIGTERM) or 130 (Ctrl-C)."""
    return EXIT_TERMINATED if isinstance(err, Terminated) else EXIT_INTERRUPTED


def _said(terminated: bool) -> str:
    name = "SIGTERM" if terminated else "Ctrl-C (SIGINT)"
    return f"interrupted by {name}: stopped; {rerun()}"


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held back (blocked, not lost) in this thread: a child started
    meanwhile begins its life with them blocked, which ``exec`` keeps, until it unblocks
    them itself. A helper process that must outlive its stage's stop can so ignore it
    from its first instruction on, not only once its imports are done."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def stops_deferred() -> Iterator[None]:
    """A stop (Ctrl-C, SIGTERM) during the body is acted on once it has ended, by the
    handler there was before: for a few steps that must not be cut in half. (Blocking
    the signals would not do: a process-directed signal may land on another thread, and
    Python runs its handler in the main thread all the same.)"""
    main = threading.current_thread() is threading.main_thread()
    if not main or any(signal.getsignal(stop) is None for stop in STOPS):
        yield  # Python's handlers run in the main thread; None: one set outside Python
        return
    caught: list[int] = []
    before = {
        stop: signal.signal(stop, lambda signum, frame: caught.append(signum)) for stop in STOPS
    }
    try:
        yield
    finally:
        for stop, handler in before.items():
            signal.signal(stop, handler)
        if caught:
            signal.raise_signal(caught[0])


def leave_on_stop(leave: Callable[[int], object]) -> None:
    """From here a stop (Ctrl-C, SIGTERM) calls ``leave(0)``: for a stage whose work is
    done, outputs written, waiting only for its bookkeeping (the tracking worker's last
    calls). It ends the wait, not the stage: the worker, which ignores the stop, ends the
    runs itself, and DVC records the stage as done, which it is. The stop's line and exit
    code, or a traceback from a torchrun rank, would say otherwise."""
    for stop in STOPS:
        signal.signal(stop, lambda signum, frame: leave(0))


def early_interrupts() -> None:
    """Until ``run_entry`` runs: Ctrl-C or SIGTERM while a stage imports torch and its
    code (seconds) ends it with ``run_entry``'s line and exit code, not a traceback of
    the import under way (Ctrl-C) or a silent death (SIGTERM). Nothing has been written
    yet, so it exits at once. A signal ignored from the start (``nohup``) stays so."""
    for signum in STOPS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _early)


def _early(signum: int, frame: FrameType | None) -> None:
    terminated = signum == signal.SIGTERM
    if RANK_ERRORS_ENV not in os.environ:  # a rank of ``launch.relaunch``: its launcher says it
        os.write(2, f"{_said(terminated)}\n".encode())
    os._exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)


def said_of(err: BaseException) -> str:
    """The line an entry point ends with for ``err``, without its ``error: ``: the user
    error's message, the interruption, or a bug's type and first line (its traceback is
    printed too). The tracking records it as why a run failed."""
    if isinstance(err, KeyboardInterrupt):
        return _said(isinstance(err, Terminated))
    user = as_user_error(err)
    line = str(user) if user is not None else f"{type(err).__name__}: {err}"
    return (line.splitlines() or [type(err).__name__])[0][:500]


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def run_entry(fn: Callable[[], None]) -> None:
    """Run an entry point; a UserError, a full disk or memory exits 2 with one line and no
    traceback, an interruption exits 130 (SIGINT) or 143 (SIGTERM) with one line."""
    setup_logging()
    previous = signal.signal(signal.SIGTERM, _terminate)
    before = signal.getsignal(signal.SIGINT)
    if before is _early:  # from here Ctrl-C raises, so ``finally`` blocks run
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        fn()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt as err:
        print(_said(isinstance(err, Terminated)), file=sys.stderr)
        sys.exit(exit_code(err))
    except Exception as err:
        user = as_user_error(err)
        if user is None:
            raise
        print(f"error: {user}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, before)
