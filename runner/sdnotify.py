"""systemd's notify protocol (sd_notify(3)): readiness, stopping, status text and watchdog pings.

A service with ``Type=notify`` finds the datagram socket to write to in ``NOTIFY_SOCKET`` (a path, or
an abstract address written with a leading ``@``); ``WatchdogSec=`` adds ``WATCHDOG_USEC`` (and
``WATCHDOG_PID``, the process meant to ping). Without ``NOTIFY_SOCKET`` every call is a no-op, so the
daemons call these unconditionally. Watchdog pings come from a thread of their own (:class:`Watchdog`: the agent),
from an asyncio loop (:meth:`Notifier.ping_from_event_loop`: the controller, so that its stuck loop is restarted)
or from a loop of the caller's (:class:`LoopPings`: the parent of `runner server --workers N`).

The module-level functions read those variables once, on first use, and take them out of
``os.environ`` (as ``sd_notify(unset_environment=1)`` does): the processes a daemon starts (a training
job, a local node) then cannot speak for it. Standard library only.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger(__name__)

VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Watchdog:
    """Sends ``WATCHDOG=1`` every ``interval`` seconds from a daemon thread until ``stop()``."""

    def __init__(self, notifier: "Notifier", interval: float):
        self.notifier = notifier
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sd-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.notifier.notify("WATCHDOG=1")
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(1)


class LoopPings:
    """``WATCHDOG=1`` sent from a loop of the caller's own rather than a thread, so that a stuck loop stops the
    pings and the manager notices: call :meth:`tick` at every turn of the loop (it sends when one is due)."""

    def __init__(self, notifier: "Notifier"):
        self.notifier = notifier
        self.interval = notifier.watchdog_interval()
        self._next = 0.0

    def tick(self) -> None:
        if self.interval is not None and time.monotonic() >= self._next:
            self.notifier.notify("WATCHDOG=1")
            self._next = time.monotonic() + self.interval


class Notifier:
    """One service's notify socket; ``address`` None means not running under a notify-aware manager."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None, watchdog_pid: int | None = None):
        self.address = address
        self.watchdog_usec = watchdog_usec
        self.watchdog_pid = watchdog_pid

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "Notifier":
        return cls(environ.get("NOTIFY_SOCKET") or None, _positive_int(environ.get("WATCHDOG_USEC")),
                   _positive_int(environ.get("WATCHDOG_PID")))

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram; False (and a warning) when it cannot be sent."""
        if not self.address:
            return False
        target = _socket_address(self.address)
        if target is None:
            log.warning("NOTIFY_SOCKET is neither a path nor an abstract address; not notifying",
                        address=self.address)
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(assignments).encode(), target)
        except OSError as exc:
            log.warning("cannot notify the service manager", address=self.address, error=str(exc))
            return False
        return True

    def ready(self) -> bool:
        return self.notify("READY=1")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def status(self, text: str) -> bool:
        return self.notify("STATUS=" + " ".join(text.splitlines()))

    def watchdog_interval(self) -> float | None:
        """Seconds between pings (half the manager's timeout), or None when this process need not ping."""
        if not self.address or not self.watchdog_usec:
            return None
        if self.watchdog_pid is not None and self.watchdog_pid != os.getpid():
            return None
        return self.watchdog_usec / 2e6

    def start_watchdog(self) -> Watchdog | None:
        interval = self.watchdog_interval()
        if interval is None:
            return None
        log.info("watchdog pings started", interval_s=interval)
        return Watchdog(self, interval).start()

    async def ping_from_event_loop(self) -> None:
        """Ping the watchdog from the running asyncio loop until cancelled (at once done when this process need
        not ping): a loop stuck in a blocking call stops the pings, so the manager restarts the process, where
        pings from a thread would go on."""
        interval = self.watchdog_interval()
        if interval is None:
            return
        log.info("watchdog pings started", interval_s=interval, source="event loop")
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(interval)


def _positive_int(raw: str | None) -> int | None:
    try:
        value = int(raw) if raw else None
    except ValueError:
        return None
    return value if value and value > 0 else None


def _socket_address(address: str) -> str | bytes | None:
    if address.startswith("@"):
        return b"\0" + address[1:].encode()
    if address.startswith("/"):
        return address
    return None


_lock = threading.Lock()
_notifier: Notifier | None = None


def default() -> Notifier:
    """This process's notifier, built from (and then removed from) the environment on first use."""
    global _notifier
    with _lock:
        if _notifier is None:
            _notifier = Notifier.from_environ(os.environ)
            for name in VARIABLES:
                os.environ.pop(name, None)
        return _notifier


def ready() -> bool:
    """Tell the manager start-up is complete (``READY=1``)."""
    return default().ready()


def stopping() -> bool:
    """Tell the manager shutdown has begun (``STOPPING=1``)."""
    return default().stopping()


def status(text: str) -> bool:
    """A one-line status shown by ``systemctl status``."""
    return default().status(text)


def start_watchdog() -> Watchdog | None:
    """Ping the manager's watchdog from a daemon thread when ``WatchdogSec=`` asks this process to."""
    return default().start_watchdog()
