"""How ``scripts/gpu_check.py`` runs its parts: each in its own child process, with its
own time box, its result appended to the ``--out`` JSON as soon as it is known.

Why a child per part: a sticky CUDA error, an out-of-memory kill, a segfault or a hang
then costs that part alone. The child writes what it has measured so far to a result
file (``Context.report``), so a part killed at its box keeps its partial numbers.
This module imports no torch: the parent stays light and cannot be hit by CUDA.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

# `gpu_check.py --pipeline --targets`: the stages the pipeline part reproduces, space-
# separated, in the environment the part's child inherits (unset: every stage).
TARGETS = "GPU_CHECK_TARGETS"
# `gpu_check.py --pipeline --repo DIR`: the pipeline part's scratch repo, kept; a second
# invocation continues where a first one cut short stopped (unset: a temporary repo).
KEPT_REPO = "GPU_CHECK_REPO"
# `gpu_check.py --pipeline --jobs N`: the stages the pipeline part runs side by side
# (unset: gpu_check_pipeline.lanes decides).
JOBS = "GPU_CHECK_JOBS"
NO_CUDA = (
    "gpu-check: no CUDA device (torch.cuda.is_available() is False); "
    "run it on a machine with an NVIDIA GPU"
)
MARGIN_S = 3.0  # of the budget kept for the parent: killing a child, writing the file
WATCHDOG_GRACE_S = 2.0  # after its deadline, a child whose parent is gone kills itself
LOG_TAIL = 3000  # characters of a failed part's log kept in its result


class PartError(Exception):
    """A failure a part explains in one line (no traceback): dvc missing, no CUDA."""


@dataclass(frozen=True)
class Part:
    """One measurement: its name (its key in the JSON), its time box in seconds, and the
    function a child process calls with a ``Context``; ``what`` for the table in --help."""

    name: str
    box_s: float
    fn: Callable[[Context], dict[str, Any]]
    what: str = ""


@dataclass
class Context:
    """What a part's child process is given: the device, the sizes, its deadline (a
    ``time.time()``), where to write partial results, the results of earlier parts."""

    device: str
    quick: bool
    deadline: float
    result_path: Path
    out_path: Path | None = None

    def left(self) -> float:
        """Seconds left before the parent kills this part."""
        return self.deadline - time.time()

    def report(self, partial: dict[str, Any]) -> None:
        """Keep ``partial`` as this part's result so far (kept if the part is killed)."""
        _write_json(self.result_path, {"status": "running", "result": partial})

    def earlier(self) -> dict[str, Any]:
        """The ``--out`` file as it is now: the results of the parts run before this one."""
        return read_json(self.out_path) if self.out_path else {}


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} where it is missing or not a JSON object."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    """Whole or not at all (a temp file renamed over it): readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def peak_memory(out: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every ``peak_mib`` in ``out``, keyed by where it is (``throughput.preresnet20.ours``)."""
    found: dict[str, Any] = {}
    for key, value in out.items():
        if key == "peak_mib" and not isinstance(value, dict):
            found[prefix.rstrip(".")] = value
        elif key == "peak_mib":
            found.update({f"{prefix}{k}": v for k, v in value.items()})
        elif isinstance(value, dict) and key != "peak_memory_mib":
            found.update(peak_memory(value, f"{prefix}{key}."))
    return found


# --- the child ----------------------------------------------------------------------------


def _watchdog(deadline: float) -> None:
    """Kill this child's process group a little after its deadline: the parent does so
    at the deadline, but a parent killed outright (SIGKILL) would leave it running."""
    time.sleep(max(0.0, deadline - time.time()) + WATCHDOG_GRACE_S)
    if os.getpgid(0) == os.getpid():  # its own group, as the parent starts it
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def child_main(part: Part, ctx: Context, setup: Callable[[], None] = lambda: None) -> None:
    """``setup()`` then ``part`` in this (child) process, its result (or error) left in
    ``ctx.result_path``; exits with ``os._exit``: no teardown (CUDA, loader workers) can
    hang it."""
    threading.Thread(target=_watchdog, args=(ctx.deadline,), daemon=True).start()
    status: dict[str, Any]
    try:
        setup()
        result = part.fn(ctx)
        status = {"status": "ok", "result": result}
    except PartError as err:
        status = {"status": "error", "error": str(err)}
    except BaseException as err:  # every failure, SystemExit included, is the part's result
        status = {
            "status": "error",
            "error": f"{type(err).__name__}: {err}"[:2000],
            "traceback": traceback.format_exc()[-6000:],
        }
    if status["status"] == "error":
        partial = read_json(ctx.result_path).get("result")
        if partial:
            status["partial"] = partial
    _write_json(ctx.result_path, status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if status["status"] == "ok" else 1)


# --- the parent ---------------------------------------------------------------------------


def _died(code: int) -> str:
    """Why a child that wrote no final result ended, in words."""
    if code < 0:
        try:
            name = f" ({signal.Signals(-code).name})"
        except ValueError:
            name = ""
        oom = ", as the out-of-memory killer sends" if -code == signal.SIGKILL else ""
        return f"the process died of signal {-code}{name}{oom}"
    return f"the process exited with code {code} without a result"


def _wait(proc: subprocess.Popen[bytes], box: float) -> bool:
    """Wait up to ``box`` s; True if it ended. Then its whole process group is killed
    (loader workers, stage processes), while the child is still an unreaped zombie, so
    its pid (the group's id) cannot have been reused."""
    ends = time.monotonic() + box
    ended = False
    try:
        while time.monotonic() < ends:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                ended = True
                break
            time.sleep(0.1)
    finally:  # Ctrl-C or SIGTERM to the parent ends the part too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return ended


def _tail(log: Path, start: int) -> str:
    with log.open("rb") as f:
        f.seek(max(start, log.stat().st_size - LOG_TAIL))
        return f.read().decode(errors="replace")


def run_part(
    part: Part, box: float, argv: list[str], log: Path, tmp: Path, out: Path
) -> dict[str, Any]:
    """One part in a child process (``argv`` + where to write), killed after ``box`` s."""
    result_path = tmp / f"{part.name}.json"
    deadline = time.time() + box
    cmd = [*argv, "--run-part", part.name, "--result", str(result_path)]
    cmd += ["--deadline", f"{deadline:.3f}", "--out", str(out)]
    with log.open("ab") as f:
        f.write(f"\n===== {part.name} (box {box:.0f} s) {_now()} =====\n".encode())
        start = f.tell()
        f.flush()
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=f, start_new_session=True
        )
        ended = _wait(proc, box)
    seconds = round(time.monotonic() - started, 1)
    found = read_json(result_path)
    code = proc.returncode
    if found.get("status") == "ok":
        result = dict(found["result"])
        if not ended:
            result["note"] = "killed at its time box after it had written its result"
        return {**result, "seconds": seconds}
    failed: dict[str, Any] = {}
    if found.get("status") == "error":
        failed = {k: v for k, v in found.items() if k != "status"}
    elif not ended:
        why = "its time box" if box == part.box_s else "what the budget left it"
        failed["error"] = f"timed out after {box:.0f} s ({why})"
    else:
        failed["error"] = _died(code)
    if "partial" not in failed and found.get("result"):
        failed["partial"] = found["result"]
    failed.update(seconds=seconds, exit_code=code)
    if "traceback" not in failed:
        failed["log_tail"] = _tail(log, start)
    return failed


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def run_parts(
    parts: Sequence[Part],
    argv: list[str],
    out: Path,
    budget: float,
    invocation: dict[str, Any],
    stop: Callable[[str, dict[str, Any]], str | None] = lambda name, result: None,
    stream: TextIO | None = None,
) -> dict[str, Any]:
    """Every part in order, each within its box, ``out`` rewritten whole after each
    (earlier keys kept, this part's replaced) and ``{name: result}`` printed as one line.

    A budget under the boxes' sum scales them (``scale``): each part may use its whole
    box but must leave every later part its scaled box, so time an early part did not
    use goes to the later ones, and each part gets at least its scaled share. A part
    with under 1 s (or a third of its scaled box) is skipped. ``stop(name, result)``:
    a reason to skip the rest (no CUDA), or None. Returns this invocation's results."""
    started = time.monotonic()
    deadline = started + budget - MARGIN_S
    scale = min(1.0, max(budget - MARGIN_S, 0.0) / max(sum(p.box_s for p in parts), 1e-9))
    log = out.with_suffix(".log")
    results: dict[str, Any] = {}
    stopped: str | None = None
    saved = read_json(out)
    invocation = {**invocation, "started": _now(), "box_scale": round(scale, 3)}
    runs = [*saved.get("gpu_check", {}).get("runs", []), invocation]
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for i, part in enumerate(parts):
            left = deadline - time.monotonic()
            later = scale * sum(p.box_s for p in parts[i + 1 :])
            box = min(part.box_s, left - later)
            if stopped is not None:
                result: dict[str, Any] = {"skipped": stopped}
            elif box < max(1.0, scale * part.box_s / 3):
                result = {
                    "skipped": f"{max(box, 0):.1f} s of the {budget:.0f} s budget left for it "
                    f"(its time box: {part.box_s:.0f} s, scaled {scale * part.box_s:.0f} s)"
                }
            else:
                print(f"gpu-check: {part.name} (box {box:.0f} s)", file=sys.stderr, flush=True)
                try:
                    result = run_part(part, box, argv, log, Path(tmp), out)
                except Exception as err:  # the parent's own failure (no fork, a full disk)
                    result = {"error": f"could not run it: {type(err).__name__}: {err}"}
                stopped = stop(part.name, result)
            results[part.name] = result
            saved = read_json(out)  # whatever else wrote it meanwhile is kept
            saved[part.name] = result
            runs[-1]["seconds"] = round(time.monotonic() - started, 1)
            saved["gpu_check"] = {"runs": runs}
            saved["peak_memory_mib"] = peak_memory(
                {k: v for k, v in saved.items() if k != "gpu_check"}
            )
            _write_json(out, saved)
            line = json.dumps({part.name: result}, default=str)
            print(line, file=stream or sys.stdout, flush=True)
    return results
