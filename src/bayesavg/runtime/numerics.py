"""The same bytes on every x86-64 CPU: a fixed thread count and a pinned instruction set.

A CPU kernel's result depends on how it splits the work (the intra-op
thread count, not the number of cores) and on which code path it takes
(AVX-512 or AVX2 kernels in ATen, oneDNN's JIT, MKL's dispatch). Left to
themselves, torch, oneDNN and MKL pick the widest instruction set the CPU
has and as many threads as it has cores, so a pipeline's bytes change from
machine to machine. ``pin`` fixes both through the environment variables
these libraries read once, when torch is first imported: so it must run
before that, and every entry point (each stage's ``_bootstrap``, the
``bayesavg`` command, the tests) calls it first. torchrun's ranks inherit
the environment, so every rank runs with the same settings.

``BAYESAVG_THREADS`` is the intra-op thread count of every stage and rank.
Unset, it is ``DEFAULT_THREADS`` (1) shared among the ranks of a torchrun job
(``WORLD_SIZE``, at least 1 each), so N ranks never run more threads than one
process would. It never depends on the machine's cores, so the bytes stay the
same on every machine at a given (N, threads). ``BAYESAVG_NUMERICS=native`` leaves the
instruction set to the libraries (faster on AVX-512 machines, bytes tied to
the CPU); the default, ``portable``, pins AVX2 where the CPU has it. This
module does not import torch.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import MutableMapping
from functools import cache

from .errors import UserError

THREADS_ENV = "BAYESAVG_THREADS"
MODE_ENV = "BAYESAVG_NUMERICS"
MODES = ("portable", "native")
# A fixed count, not the core count, so a machine with any number of cores computes the
# same bytes. One, not more: a second thread buys a stage only 1/1.2 of its time on this
# project's small networks (README, "The same bytes on another machine"), while a second
# stage beside it (scripts/repro.py, `make run`) doubles the work done per second.
DEFAULT_THREADS = 1
# The variables ATen, oneDNN and MKL read at start-up: AVX2 kernels everywhere, and
# MKL's conditional numerical reproducibility for its BLAS. (MKL's vector math ignores
# it on this project's AMD CPU: hence ``bayesavg.training.ieee``.)
ISA_PINS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_CBWR": "COMPATIBLE",
    "MKL_DYNAMIC": "FALSE",
}
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# AVX2 kernels also use FMA: a CPU needs both for the pinned path.
NEEDED_FLAGS = frozenset({"avx2", "fma"})


def threads(environ: MutableMapping[str, str] | None = None) -> int:
    """The intra-op thread count of this stage or rank: ``BAYESAVG_THREADS``, else
    ``DEFAULT_THREADS`` divided among the ranks of its torchrun job (at least 1)."""
    env = os.environ if environ is None else environ
    text = env.get(THREADS_ENV)
    if text is None:
        return max(1, DEFAULT_THREADS // world_size(env))
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise UserError(f"{THREADS_ENV}: must be a positive integer (got {text!r})")
    return int(text)


def world_size(environ: MutableMapping[str, str]) -> int:
    """The processes of this torchrun job (``WORLD_SIZE``, which torchrun sets in each
    rank), or 1 outside one."""
    text = environ.get("WORLD_SIZE", "1")
    return int(text) if text.isascii() and text.isdigit() and int(text) > 0 else 1


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, as taskset or a container's
    cpuset limits it), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def oversubscribed(
    processes: int, environ: MutableMapping[str, str] | None = None, cores: int | None = None
) -> str | None:
    """One line if ``processes`` local processes of ``threads`` threads each would run
    more threads than there are usable cores (each waits on the others: a 2-process
    DSWAG stage took 150 s instead of 9), else None."""
    env = dict(os.environ if environ is None else environ)
    env["WORLD_SIZE"] = str(processes)
    each = threads(env)
    have = usable_cores() if cores is None else cores
    if processes * each <= have:
        return None
    return (
        f"{processes} processes x {each} threads on {have} usable cores: oversubscribed, "
        f"slower than fewer processes (BAYESAVG_NPROC) or threads ({THREADS_ENV})"
    )


def mode(environ: MutableMapping[str, str] | None = None) -> str:
    """``portable`` (the default: pinned instruction set) or ``native``."""
    env = os.environ if environ is None else environ
    value = env.get(MODE_ENV, "portable")
    if value not in MODES:
        raise UserError(f"{MODE_ENV}: must be one of {', '.join(MODES)} (got {value!r})")
    return value


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (empty where it does not)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def can_pin(machine: str | None = None, flags: frozenset[str] | None = None) -> bool:
    """Whether the AVX2 path exists here: an x86-64 CPU with AVX2 and FMA. Elsewhere
    ATen would be told to run instructions the CPU lacks, so nothing is pinned."""
    arch = (machine or platform.machine()).lower()
    have = cpu_flags() if flags is None else flags
    return arch in ("x86_64", "amd64") and have >= NEEDED_FLAGS


def pin(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the thread count and, in portable mode on an AVX2 CPU, the instruction set;
    return what was set. Once torch is imported the libraries have read the environment,
    so a change then is refused rather than silently not applied (a repeat is fine)."""
    env = os.environ if environ is None else environ
    settings = dict.fromkeys(THREAD_VARS, str(threads(env)))
    if mode(env) == "portable" and can_pin():
        settings.update(ISA_PINS)
    changed = sorted(k for k, v in settings.items() if env.get(k) != v)
    if changed and environ is None and "torch" in sys.modules:
        raise RuntimeError(
            f"bayesavg.runtime.numerics.pin() after torch was imported would change "
            f"{', '.join(changed)}"
        )
    env.update(settings)
    folder = keyed_kernel_cache(env)
    if folder is not None:
        settings[CACHE_ENV] = folder
    return settings


CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def keyed_kernel_cache(env: MutableMapping[str, str]) -> str | None:
    """Give ``compile: true``'s inductor a kernel cache per instruction-set pin
    (``bayesavg-avx2``, ``bayesavg-native`` under inductor's default folder), unless the
    user chose one; returns the folder set, or None. Set here, before torch loads:
    importing torchvision or dynamo fixes inductor's folder on first use.

    Why: inductor keys its kernels by code and torch version, not by the environment
    pinned here (``ATEN_CPU_CAPABILITY``, oneDNN's ISA). A step compiled under
    ``BAYESAVG_NUMERICS=native`` and reused under the AVX2 pins aborted the process
    (tests/test_compile.py)."""
    if env.get(CACHE_ENV):
        return None
    import getpass
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (containers): torch's own fallback
        user = "unknown"
    isa = env.get("ATEN_CPU_CAPABILITY") or "native"
    name = "torchinductor_" + "".join(c if c.isalnum() or c in "-_" else "_" for c in user)
    env[CACHE_ENV] = folder = os.path.join(tempfile.gettempdir(), name, f"bayesavg-{isa}")
    return folder


def describe() -> dict[str, str]:
    """What this process computes with, for MLflow and the report: the thread count,
    the mode, and what torch dispatches to. Imports torch."""
    import torch

    return {
        "threads": str(torch.get_num_threads()),
        "numerics": mode(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "pinned": str(os.environ.get("ATEN_CPU_CAPABILITY") == ISA_PINS["ATEN_CPU_CAPABILITY"]),
    }
