"""The report's independent parts on every usable core.

Given its inputs, a report is many independent pieces of work: one predictor's
bootstrap intervals need nothing of another's, and a section needs only the inputs
and the intervals. Written one after another they took 30 s of the pipeline's last
stage, which nothing else runs beside (8.5 s of intervals, 21.7 s of sections, on
one core of this project's 2-core machine; 6.3 s and 12.3 s on two). ``fork_map``
runs them in forked processes, as many as the usable cores hold at
``BAYESAVG_THREADS`` threads each. Forked, the processes inherit the inputs (tens of
MB of per-point predictions) instead of receiving a pickled copy; only an index goes
out and a result comes back. Results come back in the order of the items, and each is
what the same call returns here, so the report's bytes do not depend on how many
processes ran (tests compare 1 with 2).

A child forked from a process whose OpenMP thread pool exists hangs at its first
parallel region (GNU OpenMP is not fork-safe; seen here: ``write_report`` called after
torch had computed on 2 threads never returned). torch on one intra-op thread never
starts that pool, so ``fork_map`` forks only where torch is not imported yet or runs
one thread, as every stage does at the default ``BAYESAVG_THREADS``. Otherwise, and
where one process is all the cores hold or ``fork`` does not exist, everything runs
here, with the same results.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

from ..runtime import numerics

T = TypeVar("T")
R = TypeVar("R")

# The work of the running ``fork_map``, which its forked processes inherit.
_job: tuple[Callable[[Any], Any], Sequence[Any]] | None = None
# Set in a forked process: a ``fork_map`` there runs in that process.
_forked = False


def processes() -> int:
    """How many processes the usable cores hold at this stage's thread count."""
    return max(1, numerics.usable_cores() // numerics.threads())


def fork_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(item) for item in items]``, on up to ``processes()`` forked processes."""
    global _job
    n = min(len(items), processes())
    if n <= 1 or _forked or not _can_fork():
        return [fn(item) for item in items]
    _job = (fn, items)
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(n, mp_context=context) as pool:
            return list(pool.map(_call, range(len(items))))
    finally:
        _job = None


def _can_fork() -> bool:
    """Whether a forked child can run torch: no OpenMP pool can exist here yet."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    torch = sys.modules.get("torch")
    return torch is None or torch.get_num_threads() == 1


def _call(index: int) -> Any:
    """Item ``index`` of the inherited job, in a forked process."""
    global _forked
    _forked = True
    assert _job is not None
    fn, items = _job
    return fn(items[index])
