"""The error handling every entry point shares (the CLI and the DVC stages).

A ``UserError`` becomes one line on stderr and exit code 2; an interruption (Ctrl-C,
or SIGTERM from a timeout, a cancelled job or ``kill``) one line and the shell's exit
code for that signal, 130 or 143; anything else is a bug and keeps its traceback. A
module of its own so that a stage importing it does not import the CLI (and with it the
whole evaluation code).
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from types import FrameType

from .errors import EXIT_USER_ERROR, UserError

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a Ctrl-C
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143


class Terminated(KeyboardInterrupt):
    """SIGTERM raised as Ctrl-C is: ``finally`` blocks, the atomic writes' clean-up and
    the tracked run's end (KILLED) happen, which the default SIGTERM (die at once) skips."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def run_entry(fn: Callable[[], None]) -> None:
    """Run an entry point; a UserError exits 2 with one line and no traceback, an
    interruption exits 130 (SIGINT) or 143 (SIGTERM) with one line."""
    setup_logging()
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        fn()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt as err:
        terminated = isinstance(err, Terminated)
        name = "SIGTERM" if terminated else "Ctrl-C (SIGINT)"
        print(
            f"interrupted by {name}: stopped; run it again to go on (a fine-tuning stage "
            "resumes from its last checkpoint)",
            file=sys.stderr,
        )
        sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
    finally:
        signal.signal(signal.SIGTERM, previous)
