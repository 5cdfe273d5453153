"""Whether each worker of `runner server --workers N` still answers: systemd's watchdog protocol, with the parent as
the manager.

A worker whose event loop is stuck (its process alive, answering nothing) keeps its listening socket, and the
kernel goes on giving it its share of the port's new connections; watching exits alone would never notice it. So
the supervisor starts each worker with ``WATCHDOG_USEC`` beside ``NOTIFY_SOCKET``, exactly as systemd starts a
unit with ``WatchdogSec=``, and the worker pings ``WATCHDOG=1`` from its event loop every half of it
(runner/controller/daemon.py), as it does for systemd when it runs alone. A worker that has said it is ready and
then stays silent longer than the interval is killed with SIGKILL (a stuck loop would not handle SIGTERM) and
started again like any worker that dies.

The interval is the parent's own ``WatchdogSec`` when systemd watches it (a worker silent that long is as stuck
as the parent would be), else 30 s, systemd's interval in the project's unit.
"""

from __future__ import annotations

import time

from ..sdnotify import Notifier

WATCHDOG_SECONDS = 30.0


def watchdog_seconds(manager: Notifier) -> float:
    """How long a worker may be silent: the parent's own manager's watchdog timeout, else the default."""
    if manager.watchdog_interval() is not None:
        return manager.watchdog_usec / 1e6
    return WATCHDOG_SECONDS


def worker_environment(seconds: float) -> dict[str, str]:
    """The variables that ask a worker to ping (``NOTIFY_SOCKET`` aside, which names the supervisor's socket)."""
    return {"WATCHDOG_USEC": str(max(1, round(seconds * 1e6)))}


class Liveness:
    """When each watched worker was last heard from, by pid. A worker is watched from its ``READY=1`` on: its
    start-up (imports, opening the database) may take long on a busy machine and is not its loop being stuck."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._heard: dict[int, float] = {}

    def ready(self, pid: int) -> None:
        self._heard[pid] = time.monotonic()

    def pinged(self, pid: int) -> None:
        if pid in self._heard:
            self._heard[pid] = time.monotonic()

    def forget(self, pid: int) -> None:
        self._heard.pop(pid, None)

    def silent_for(self, pid: int) -> float | None:
        """Seconds since a watched worker was last heard from, when longer than the interval; else None."""
        heard = self._heard.get(pid)
        if heard is None:
            return None
        silent = time.monotonic() - heard
        return silent if silent > self.seconds else None
