"""The first import of every stage: check the environment, pin the numerics, start tracking.

``.venv/bin/dvc repro`` without the environment activated runs each stage
with whatever ``python`` is first on PATH, which would fail with a
``ModuleNotFoundError`` traceback: say so in one line instead (modules are
looked up, not imported), and so does a torch or torchvision older than the oldest
supported (``bayesavg.runtime.torch_version``: their version files are read, not
imported). Then, before anything heavy is imported, start
the MLflow tracking worker, so that its ~2 s of importing mlflow and
opening the store overlap the stage's own imports and work
(``bayesavg.tracking.worker``). Before torch is imported, fix the thread count
and the instruction set (``bayesavg.runtime.numerics``), so the stage computes the
same bytes on any x86-64 CPU; torchrun's ranks inherit them. Stages in
``UNTRACKED`` log nothing, and of a torchrun job only rank 0 does.
"""

import time

STARTED = time.perf_counter()  # the stage's first line: its start-up is measured from here
STARTED_AT = time.time()  # the same moment on the clock: when the stage's MLflow run starts

import importlib.util  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

_NEEDED = ("bayesavg", "torch", "yaml", "mlflow")
UNTRACKED = ("validate",)

missing = [name for name in _NEEDED if importlib.util.find_spec(name) is None]
if missing:
    sys.stderr.write(
        f"error: {sys.executable} cannot import {', '.join(missing)}: run the pipeline in the "
        "project's environment: `make run`, or `source .venv/bin/activate` then `dvc repro` "
        "(`dvc checkout` puts back the outputs DVC removed before this stage)\n"
    )
    sys.exit(2)

from bayesavg.runtime.entry import early_interrupts  # noqa: E402  (no torch)

early_interrupts()  # Ctrl-C or SIGTERM during the imports: run_entry's line and code

from bayesavg.runtime.torch_version import check_importable  # noqa: E402  (imports nothing)

unsupported = check_importable()
if unsupported:
    sys.stderr.write(f"error: {sys.executable}: {unsupported}\n")
    sys.exit(2)

from bayesavg.runtime import numerics  # noqa: E402  (after the check above)
from bayesavg.runtime.entry import run_entry  # noqa: E402

run_entry(numerics.pin)  # a bad BAYESAVG_THREADS or BAYESAVG_NUMERICS: one line, exit 2

from bayesavg.tracking.source import default_store  # noqa: E402
from bayesavg.tracking.worker import Tracker  # noqa: E402


def project_root() -> Path:
    """The repo whose mlflow.db and mlartifacts/ receive this run.

    DVC sets ``DVC_ROOT`` to the parent repo also for ``dvc exp run --temp``
    and ``--queue``, whose stages run in a temporary copy under .dvc/tmp.
    """
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()).resolve()


def spool_dir() -> Path:
    """Where tracking calls that could not be sent wait (``bayesavg.tracking.spool``)."""
    return project_root() / "runs" / "spool"


untracked = Path(sys.argv[0]).stem in UNTRACKED or os.environ.get("RANK", "0") != "0"
tracker = None if untracked else Tracker.spawn(*default_store(project_root()), spool_dir())
