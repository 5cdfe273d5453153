"""The processes of one attempt of a job on this machine, found by the variables the runner gives the job."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def attempt_processes(job_id: str, attempt: int) -> list[int]:
    """Every live process whose environment says it belongs to ``attempt`` of ``job_id``."""
    marks = {f"RUNNER_JOB_ID={job_id}".encode(), f"RUNNER_ATTEMPT={attempt}".encode()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] not in "ZX" and marks <= environ:
            found.append(int(entry.name))
    return found


def wait_until_gone(job_id: str, attempt: int, timeout: float) -> list[int]:
    """Poll until no process of the attempt is left; the ones still alive at ``timeout`` (then killed, so a
    failing test leaves nothing behind)."""
    deadline = time.monotonic() + timeout
    while (left := attempt_processes(job_id, attempt)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def agent_pid(home: Path, node_id: str) -> int:
    """The pid of the agent of the local node ``node_id``."""
    config = str(home / "nodes" / node_id / "agent.yaml").encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"agent" in argv and config in argv:
                return int(entry.name)
    raise AssertionError(f"no agent process for node {node_id}")
