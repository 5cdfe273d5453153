"""The sockets of each world's process groups, so that a world formed after a loss can cut the older ones off
(elastic gangs, docs/elastic.md).

A rank waiting in a gloo collective (DDP's all-reduce, the step agreement, a save's collective) waits for its
peer's bytes until the group's timeout (``RUNNER_ELASTIC_TIMEOUT_SECONDS``) or an error on the pair's socket;
nothing else ends it: ``ProcessGroupGloo.abort()`` and ``shutdown()`` return at once and leave the pending
receive waiting (torch 2.13). A machine that vanishes sends no reset, so a survivor blocked on it would wait out
the timeout although the controller has already formed a world without it. So the sockets that each world's
groups open are noted as the groups are made (this process's sockets before and after), and when a world formed
after a loss arrives, the connected ones of every older world are shut down: gloo's reads see the end of the
stream and every pending and later operation on those pairs fails at once ("Connection closed by peer"), which the
training's TolerantGroup and the step agreement take as a lost peer. ``shutdown(2)`` goes through a duplicate of
the descriptor, so gloo's own stays valid until gloo closes it. Listening sockets are left alone: gloo's listener
aborts the process when its ``accept()`` fails.

Only sockets opened while a world's groups were being made are noted. Another thread opening one in that window
(rare: the training thread is inside the change and saves in flight are done with, or fail with the lost peer)
would be cut with them; its connection then ends as if the far end had closed it.
"""

from __future__ import annotations

import os
import socket
import threading
from contextlib import contextmanager

from .log import get_logger

log = get_logger()

_lock = threading.Lock()
_made: dict[int, set[int]] = {}          # generation -> socket inodes its groups opened
_opening: dict[int, list[set[int]]] = {}  # generation -> this process's socket inodes when each recording began


def _sockets() -> dict[int, int]:
    """This process's sockets: inode -> descriptor (empty where /proc is not there)."""
    found = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed since the listing
        if target.startswith("socket:["):
            found[int(target[8:-1])] = int(name)
    return found


@contextmanager
def recording(generation: int):
    """Note the sockets opened inside this block as belonging to the groups of world ``generation``."""
    before = set(_sockets())
    with _lock:
        _opening.setdefault(generation, []).append(before)
    try:
        yield
    finally:
        opened = set(_sockets()) - before
        with _lock:
            windows = _opening.get(generation, [])
            if before in windows:
                windows.remove(before)
            if not windows:
                _opening.pop(generation, None)
            _made.setdefault(generation, set()).update(opened)


def forget_before(generation: int) -> None:
    """The worlds before ``generation`` are left for good: their notes go (their groups close their sockets)."""
    with _lock:
        for old in [g for g in _made if g < generation]:
            del _made[old]


def sever_before(generation: int) -> int:
    """Shut down the connected sockets of every world older than ``generation`` (those of a world still being
    made included); how many were cut. Safe from any thread, and for sockets already closed."""
    current = _sockets()
    with _lock:
        targets: set[int] = set()
        for old in [g for g in _made if g < generation]:
            targets |= _made.pop(old)
        for old, windows in _opening.items():
            if old < generation:
                for before in windows:
                    targets |= set(current) - before
    cut = sum(_shut(inode, current[inode]) for inode in targets if inode in current)
    if cut:
        log.info("cut the older worlds' connections: a member of this gang was lost", sockets=cut,
                 generation=generation)
    return cut


def _shut(inode: int, fd: int) -> bool:
    try:
        dup = os.dup(fd)
    except OSError:
        return False  # closed meanwhile
    try:
        if os.fstat(dup).st_ino != inode:
            return False  # the descriptor number was reused by another file meanwhile
        sock = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return False
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return False
        sock.getpeername()  # a listener has none: it is left alone
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.close()  # the duplicate only
