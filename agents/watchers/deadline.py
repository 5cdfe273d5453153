"""HTTP to a metadata server with a total deadline on every request, not only on each read.

A read timeout bounds the wait for the next bytes, so a server that trickles its answer one byte at a time
(each byte just inside the timeout) holds a request for as long as it likes, and the watcher sees nothing
meanwhile. Here every request also has a deadline for the whole exchange, the connect and read timeouts added
up unless given: when it passes, the connection's socket is shut down, which ends any read in progress, and
the request fails with :class:`DeadlineExceeded` (a ``requests.Timeout``).
"""

from __future__ import annotations

import socket
import threading

import requests
import urllib3
from requests.adapters import HTTPAdapter

from runner.errors import RunnerError


class DeadlineExceeded(RunnerError, requests.Timeout):
    """The whole answer did not arrive within the request's deadline."""


class _Tracker:
    """The connection a session's request is using now (one request at a time per session)."""

    def __init__(self) -> None:
        self.active: urllib3.connection.HTTPConnection | None = None

    def abort(self) -> None:
        sock = getattr(self.active, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _pool_class(tracker: _Tracker) -> type[urllib3.HTTPConnectionPool]:
    class TrackedConnection(urllib3.connection.HTTPConnection):
        def request(self, *args, **kwargs):
            tracker.active = self
            return super().request(*args, **kwargs)

    class TrackedPool(urllib3.HTTPConnectionPool):
        ConnectionCls = TrackedConnection

    return TrackedPool


def total_of(timeout) -> float | None:
    """The whole request's deadline implied by a requests ``timeout`` (connect + read)."""
    if timeout is None:
        return None
    if isinstance(timeout, tuple):
        parts = [part for part in timeout if part is not None]
        return sum(parts) if len(parts) == len(timeout) else None
    return 2 * float(timeout)


class DeadlineSession(requests.Session):
    """A session for plain-HTTP metadata servers: no proxies, and a total deadline on every request.

    ``request(..., deadline=S)`` sets the deadline; by default it is the connect and read timeouts added up.
    Used from one thread at a time (each watcher has its own session).
    """

    def __init__(self) -> None:
        super().__init__()
        self.trust_env = False  # metadata servers are link-local (or loopback): never through a proxy
        self._tracker = _Tracker()
        adapter = HTTPAdapter()
        classes = dict(adapter.poolmanager.pool_classes_by_scheme)
        classes["http"] = _pool_class(self._tracker)
        adapter.poolmanager.pool_classes_by_scheme = classes
        self.mount("http://", adapter)

    def request(self, method, url, *args, deadline: float | None = None, **kwargs):
        total = deadline if deadline is not None else total_of(kwargs.get("timeout"))
        if total is None:
            return super().request(method, url, *args, **kwargs)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            self._tracker.abort()

        timer = threading.Timer(total, expire)
        timer.daemon = True
        timer.start()
        try:
            return super().request(method, url, *args, **kwargs)
        except requests.RequestException:
            if expired.is_set():
                raise DeadlineExceeded(f"{method} {url}: no complete answer within {total:g} s") from None
            raise
        finally:
            timer.cancel()
