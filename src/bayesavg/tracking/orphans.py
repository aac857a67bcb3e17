"""Runs left RUNNING by a process that is gone, ended KILLED by the next one to open a run.

A tracking worker ends its run when the stage ends it, fails, or vanishes (its stdin
closes). A SIGKILL to the whole process group (the OOM killer, ``kill -9 -PGID``, a CI
runner's hard timeout) takes the worker too, and nothing is left to end the run: MLflow
would show it RUNNING for ever, and its execution's parent run with it. So every run
names the process that ends it (``OWNER_TAG``: the machine, the pid and the process's
start time, so a reused pid is not taken for it), and the first run a process opens in
an experiment ends KILLED every RUNNING run there whose owner on this machine is gone,
saying so in ``ENDED_TAG`` (dropped if the run's own end arrives after all: calls a
tracking outage spooled, replayed later). Runs owned on other machines (a shared
tracking server) are theirs to end.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import suppress
from typing import Any

from .mlflow_run import ENDED_TAG, EXECUTION_TAG, PARENT_TAG, Run
from .serialized import serialized

OWNER_TAG = "bayesavg.owner"
KILLED = "KILLED"


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def machine() -> str:
    """This machine as its processes see it: the host name, the boot (a reboot reuses
    pids) and the pid namespace (containers sharing a host name number pids apart)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    with suppress(OSError):
        boot += "/" + os.readlink("/proc/self/ns/pid")
    return f"{socket.gethostname()}/{boot}"


def _started(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), "" if unknown or gone
    (a zombie, dead but not yet reaped, is gone).

    The name in ``/proc/<pid>/stat`` may hold spaces and parentheses: the fields
    are counted after its last ``)``; the state is the 3rd, the start time the 22nd."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else ""


def owner(pid: int | None = None) -> str:
    """``OWNER_TAG``'s value for process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return f"{machine()}:{pid}:{_started(pid)}"


def gone(value: str) -> bool:
    """Whether the process an ``owner`` value names, on this machine, has ended."""
    _, pid_text, started = value.rsplit(":", 2)
    pid = int(pid_text)
    if started:
        return _started(pid) != started
    try:  # no start time where it was written (not Linux): the pid alone
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _orphans(client: Any, experiment_id: str) -> list[Any]:
    """RUNNING runs of the experiment owned on this machine by a process that is gone."""
    here = machine()
    found = client.search_runs(
        [experiment_id],
        filter_string=f"attributes.status = 'RUNNING' and tags.`{OWNER_TAG}` LIKE '{here}:%'",
        max_results=1000,
    )
    return [
        r
        for r in found
        if r.data.tags[OWNER_TAG].rpartition(":")[0].rpartition(":")[0] == here
        and gone(r.data.tags[OWNER_TAG])
    ]


def _note(value: str) -> str:
    pid = value.rsplit(":", 2)[1]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return (
        f"KILLED: the process that tracked it (pid {pid}) was gone by {stamp}, when process "
        f"{os.getpid()} opened a run; it ended without ending its run (killed outright, as by "
        "a SIGKILL of its process group)"
    )


def sweep(client: Any, experiment_id: str, tracking_uri: str) -> list[str]:
    """End KILLED the orphaned runs of the experiment; return them as ``name (id)``.

    A stage's run first, recorded in its execution's parent as the stage a run of
    that execution normally records (the parent then ends KILLED too), then a parent
    left RUNNING with no running child (a stage killed between making its parent
    RUNNING and starting its own run). Each run is checked again under the lock a
    resuming stage (``store.open_run``) or its parent's writers hold, so a run taken
    over meanwhile is left alone.
    """
    ended = []
    orphans = _orphans(client, experiment_id)
    for parents in (False, True):
        for found in orphans:
            if (EXECUTION_TAG in found.data.tags) != parents:
                continue
            tags = found.data.tags
            lock = tags[EXECUTION_TAG] if parents else found.info.run_id
            with serialized(tracking_uri, lock):
                now = client.get_run(found.info.run_id)
                if now.info.status != "RUNNING" or now.data.tags.get(OWNER_TAG) != tags[OWNER_TAG]:
                    continue
                if parents and _has_running_child(client, experiment_id, found.info.run_id):
                    continue
                note = _note(tags[OWNER_TAG])
                client.set_tag(found.info.run_id, ENDED_TAG, note)
                if not parents:
                    Run(client, found.info.run_id, tracking_uri).record_in_parent(
                        found.info.run_name, None, KILLED, why=note.removeprefix("KILLED: ")
                    )
                client.set_terminated(found.info.run_id, status=KILLED)
            ended.append(f"{found.info.run_name} ({found.info.run_id})")
    return ended


def _has_running_child(client: Any, experiment_id: str, run_id: str) -> bool:
    return bool(
        client.search_runs(
            [experiment_id],
            filter_string=f"attributes.status = 'RUNNING' and tags.`{PARENT_TAG}` = '{run_id}'",
            max_results=1,
        )
    )
