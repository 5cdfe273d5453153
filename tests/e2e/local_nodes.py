"""What a test reads of the local market's nodes beside the controller: an agent's log, whether a node still runs,
the processes left of a job; and a wait for an event."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


def agent_events(home: Path, node: str) -> list[str]:
    """The ``event`` of every line of the node's agent log so far."""
    path = home / "nodes" / node / "agent.jsonl"
    if not path.exists():
        return []
    return [json.loads(line).get("event", "") for line in path.read_text().splitlines() if line.strip()]


def node_alive(home: Path, node: str) -> bool:
    from runner.providers.local.processes import ref_alive

    ref = home / "nodes" / node / "ref"
    return ref.exists() and ref_alive(ref.read_text())


def processes_naming(path: Path) -> list[int]:
    """The live processes (zombies aside) whose command line names ``path``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(path).encode() in (entry / "cmdline").read_bytes():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_processes_naming(path: Path) -> None:
    """SIGKILL every process whose command line names ``path``: what a failing test left of a job (a setup or a
    training process that outlived its node is in no node's process tree any more)."""
    for pid in processes_naming(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_until(predicate, timeout: float, what: str):
    """Poll ``predicate`` until it returns something true; return that (AssertionError after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")
