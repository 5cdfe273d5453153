"""Process bookkeeping for simulated nodes: identity that survives pid reuse, and killing a session."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def process_start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":  # a zombie is gone for our purposes
        return None
    return int(fields[19])


def process_ref(pid: int) -> str:
    """A reference to a process that stays unique if the pid is reused later."""
    return f"{pid}:{process_start_ticks(pid)}"


def ref_alive(ref: str | None) -> bool:
    if not ref:
        return False
    pid, ticks = ref.split(":")
    return str(process_start_ticks(int(pid))) == ticks


def _live_processes():
    """``(pid, stat fields after the command name)`` of every live (not zombie) process."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            yield int(entry.name), fields


def session_members(sid: int) -> list[int]:
    """Every live process whose session id is ``sid`` (the node and everything it started)."""
    return [pid for pid, fields in _live_processes() if int(fields[3]) == sid]


def kill_session(sid: int, timeout: float = 5.0) -> None:
    """SIGKILL every process of a session, as a power-off would, and wait until they are gone."""
    _kill_until_gone(lambda: session_members(sid), timeout)


def _kill_until_gone(members, timeout: float) -> None:
    """SIGKILL what ``members()`` lists, again and again, until it lists nothing or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        pids = members()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _parents() -> dict[int, int]:
    """Every live process's parent, by pid."""
    return {pid: int(fields[1]) for pid, fields in _live_processes()}


def tree_members(root: int, sid: int) -> list[int]:
    """The session's processes and every descendant of them and of ``root``, wherever they went (torchrun starts
    its workers in sessions of their own)."""
    parents = _parents()
    members = set(session_members(sid)) | ({root} if root in parents else set())
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in members} - members
        members |= more
        grew = bool(more)
    return sorted(members)


def kill_node(ref: str, timeout: float = 5.0) -> None:
    """SIGKILL what the node process ``ref`` (:func:`process_ref`) started, as a power-off would, never another
    process that has its pid since (pids wrap at 32,768 on many machines, and a test suite or a busy node starts
    thousands of processes).

    - the node process still runs: its whole tree (:func:`kill_tree`);
    - it is gone: what is left of its session (the kernel gives no new process that number while any process of
      the session lives, so the session's members are the node's);
    - its pid belongs to another process now: nothing (the number was free to be given again, so nothing of the
      node's session was left)."""
    pid, ticks = ref.split(":")
    start = process_start_ticks(int(pid))
    if start is None:
        kill_session(int(pid), timeout)
    elif str(start) == ticks:
        kill_tree(int(pid), timeout)


def kill_tree(root: int, timeout: float = 5.0) -> None:
    """SIGKILL a node's whole process tree at once, as a vanished VM's processes all stop, and wait for it.
    The tree is read before any is killed, so a worker is not orphaned out of reach first."""
    _kill_until_gone(lambda: tree_members(root, root), timeout)
