"""Stop with one line when a stage runs in a Python that lacks the project.

``.venv/bin/dvc repro`` without the environment activated runs each stage
with whatever ``python`` is first on PATH, which then fails with a
``ModuleNotFoundError`` traceback. Imported by ``_common`` before anything
outside the standard library; looks modules up without importing them.
"""

import importlib.util
import sys

_NEEDED = ("bayesavg", "torch", "yaml", "mlflow")

missing = [name for name in _NEEDED if importlib.util.find_spec(name) is None]
if missing:
    sys.stderr.write(
        f"error: {sys.executable} cannot import {', '.join(missing)}: run the pipeline in the "
        "project's environment: `make run`, or `source .venv/bin/activate` then `dvc repro`\n"
    )
    sys.exit(2)
