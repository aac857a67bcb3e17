"""The error handling every entry point shares (the CLI and the DVC stages).

A ``UserError`` becomes one line on stderr and exit code 2; anything else is
a bug and keeps its traceback. A module of its own so that a stage importing
it does not import the CLI (and with it the whole evaluation code).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from .errors import EXIT_USER_ERROR, UserError


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def run_entry(fn: Callable[[], None]) -> None:
    """Run an entry point; a UserError exits 2 with one line and no traceback."""
    setup_logging()
    try:
        fn()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
