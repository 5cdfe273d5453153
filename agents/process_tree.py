"""Every process a job's command started, wherever it went, and their end.

A process group is not enough: torchrun starts each worker in a session of its own, a daemon double-forks
and is reparented to init, and a process group outlives the leader the agent waits for. So the tree of one
command is found in /proc in two ways (Linux; elsewhere it is the process group alone):

* **parentage**: the command's process and every descendant of it, by parent pid;
* **a mark in the environment**: the agent gives the command a variable whose value is unique to it
  (``MARK``); every process that inherited its environment carries it, whatever its session or parent now
  (the way Jenkins finds the processes a build left behind).

A process is named by its pid and its start time, so a pid reused by an unrelated process is never signalled.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from runner.parent_death import die_with_parent_preexec  # noqa: F401 - the job's command dies with the agent

log = structlog.get_logger(__name__)

MARK = "RUNNER_PROCESS_TREE"  # the variable whose value is unique to one command of one agent
PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # clock ticks since boot: with the pid, unique for the machine's uptime


def new_mark() -> str:
    return secrets.token_hex(8)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start ticks) of a live process, None when it is gone or a zombie."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def running(pid: int) -> bool:
    """Whether the process is alive (not gone, not a zombie)."""
    return _stat(pid) is not None


def _carries(pid: int, mark: bytes) -> bool:
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or another user's
        return False
    return mark in environ.split(b"\0")


def members(root: int | None, mark: str | None) -> list[Proc]:
    """The live processes of the tree: ``root`` and its descendants, and every process carrying ``mark``."""
    if not PROC.is_dir():
        return []
    me = os.getpid()
    stats: dict[int, tuple[int, int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and int(entry.name) != me:
            found = _stat(int(entry.name))
            if found is not None:
                stats[int(entry.name)] = found
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    chosen: set[int] = set()
    if root is not None and root in stats:
        todo = [root]
        while todo:
            pid = todo.pop()
            if pid not in chosen:
                chosen.add(pid)
                todo.extend(children.get(pid, ()))
    if mark:
        needle = f"{MARK}={mark}".encode()
        chosen.update(pid for pid in stats if pid not in chosen and _carries(pid, needle))
    return [Proc(pid, stats[pid][1]) for pid in sorted(chosen)]


def _alive(proc: Proc) -> bool:
    found = _stat(proc.pid)
    return found is not None and found[1] == proc.start


def signal_all(procs: list[Proc], signum: int) -> None:
    for proc in procs:
        if _alive(proc):  # the same process, not a reused pid
            try:
                os.kill(proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


def end_tree(root: int | None, mark: str | None, grace: float, timeout: float = 10.0) -> list[Proc]:
    """SIGTERM every process of the tree, SIGKILL what is left after ``grace`` seconds, and wait (up to
    ``timeout`` more) until none is left, looking again each round for processes forked meanwhile. Returns
    the processes still alive at the end (in uninterruptible sleep, say); [] when the tree is gone."""
    procs = members(root, mark)
    if not procs:
        return []
    log.warning("processes of the job are left; ending them", pids=[p.pid for p in procs])
    signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while procs and time.monotonic() < deadline:
        time.sleep(0.05)
        procs = [p for p in procs if _alive(p)] + [p for p in members(root, mark) if p not in procs]
    deadline = time.monotonic() + timeout
    while True:
        procs = members(root, mark)
        if not procs:
            return []
        if time.monotonic() > deadline:
            log.error("processes of the job outlived SIGKILL", pids=[p.pid for p in procs])
            return procs
        signal_all(procs, signal.SIGKILL)
        time.sleep(0.05)
