"""Parts that misbehave on purpose, for tests/test_gpu_check.py: the script runs these
instead of its own where ``$GPU_CHECK_TEST_PARTS`` names this file. Each reports which
parts the ``--out`` file held when it started (``seen``): all earlier ones, if the file
is rewritten whole after every part."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from gpu_check_runner import Context, Part, PartError


def _seen(ctx: Context) -> list[str]:
    return [k for k in ctx.earlier() if k not in ("gpu_check", "peak_memory_mib")]


def works(ctx: Context) -> dict[str, Any]:
    return {"seen": _seen(ctx), "peak_mib": 12.5}


def raises(ctx: Context) -> dict[str, Any]:
    ctx.report({"seen": _seen(ctx), "measured": 1})
    raise ValueError("a measurement failed")


def hangs(ctx: Context) -> dict[str, Any]:
    """Reports, starts a grandchild (a loader worker, a stage) and hangs: the time box
    must end both, and keep what was reported."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    ctx.report({"seen": _seen(ctx), "rounds_done": 1, "grandchild": sleeper.pid})
    time.sleep(120)
    return {"never": True}


def killed(ctx: Context) -> dict[str, Any]:
    ctx.report({"seen": _seen(ctx), "before_the_kill": True})
    os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does
    return {}


def exits(ctx: Context) -> dict[str, Any]:
    os._exit(137)


def explains(ctx: Context) -> dict[str, Any]:
    raise PartError("dvc is not installed")


def sleeps(ctx: Context) -> dict[str, Any]:
    time.sleep(5)
    return {"seen": _seen(ctx)}


PARTS = (
    Part("works", 20, works),
    Part("raises", 20, raises),
    Part("hangs", 2, hangs),
    Part("killed", 20, killed),
    Part("exits", 20, exits),
    Part("explains", 20, explains),
    Part("last", 20, works),
    Part("sleeps", 6, sleeps),
    Part("after", 20, works),
)
