"""What the three fake metadata servers share: HTTP plumbing, request counting, faults, the admin API.

Each fake is a real HTTP server on loopback (a ``ThreadingHTTPServer`` in a daemon thread), so the
real clients (botocore, google-auth, our watchers) talk to it exactly as they would to the cloud's.
Another process drives it through an admin API under ``/_fake/``, a prefix no real server uses:

    POST /_fake/notice  {"op": "preempt", "deadline_seconds": 120}   (cloud-specific ops too)
    POST /_fake/fault   {"kind": "status", "status": 503, "count": 3, "path": "/latest/", "method": "GET"}
    POST /_fake/reset   {}
    GET  /_fake/stats   -> {"requests": 12, "by_path": {...}}

Admin requests are neither counted nor subject to faults.
"""

from __future__ import annotations

import dataclasses
import json
import select
import socket
import sys
import threading
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

ADMIN_PREFIX = "/_fake/"
FAULT_KINDS = ("status", "garbage", "slow", "drop", "trickle")

# Bodies that look like what a broken proxy or a half-written answer returns; none is a valid notice.
GARBAGE = (
    b'{"action": "termin',
    b"<html><body><h1>502 Bad Gateway</h1></body></html>",
    b"\xff\xfe\x00\x01garbage\x00",
    b"true-ish",
    b"[[[",
)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: Message
    body: bytes


@dataclass
class Response:
    status: int = 200
    body: bytes | str = b""
    headers: dict[str, str] = field(default_factory=dict)
    trickle: float = 0.0  # seconds between the bytes of the whole answer (status line and headers too)

    def encoded(self) -> bytes:
        return self.body.encode() if isinstance(self.body, str) else self.body


DROP = Response(0)  # sentinel: hold the connection and never answer


@dataclass
class Fault:
    """One injected misbehaviour, applied to the next ``count`` matching requests (``None``: until reset).

    kinds: ``status`` answers ``status`` with an empty body; ``garbage`` answers 200 with a body that no
    protocol accepts; ``slow`` waits ``delay`` seconds, then answers normally; ``drop`` reads the request
    and never answers (a dropped packet, as IMDS does to a token PUT beyond the hop limit); ``trickle``
    answers normally but one byte every ``delay`` seconds, from the status line on, so that no single read
    waits long.
    """

    kind: str
    count: int | None = None
    status: int = 503
    delay: float = 0.0
    path: str | None = None
    method: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {', '.join(FAULT_KINDS)}")

    def matches(self, request: Request) -> bool:
        if self.method and self.method.upper() != request.method:
            return False
        return not self.path or request.path.startswith(self.path)


class FakeMetadataServer:
    """A loopback metadata server; subclasses answer one cloud's protocol in :meth:`handle`."""

    cloud = ""
    server_header = "fake-metadata"

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self._address = (host, port)
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._faults: list[Fault] = []
        self._garbage_turn = 0
        self._requests = 0
        self._by_path: dict[str, int] = {}
        self._connections: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------
    def start(self) -> "FakeMetadataServer":
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = _Server(self._address, _handler_for(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.5},
                                        name=f"fake-{self.cloud}-metadata", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: new connections are refused and open ones are cut, as when a server dies."""
        if self._httpd is None:
            return
        port = self.port
        self._stopping.set()
        self._wake_waiters()
        stopper = threading.Thread(target=self._httpd.shutdown, daemon=True)
        stopper.start()
        try:  # wake the accept loop now rather than at its next poll
            socket.create_connection((self._address[0], port), timeout=0.5).close()
        except OSError:
            pass
        stopper.join()
        self._httpd.server_close()
        with self._lock:
            for conn in list(self._connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._thread.join(timeout=2)
        self._httpd = None
        self._address = (self._address[0], port)  # a restart comes back on the same port

    def __enter__(self) -> "FakeMetadataServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1] if self._httpd else self._address[1]

    @property
    def url(self) -> str:
        return f"http://{self._address[0]}:{self.port}"

    @property
    def endpoint(self) -> str:
        """The value for this cloud's endpoint variable (docs/environment.md)."""
        return self.url

    # --- faults and counters (thread-safe) -----------------------------------
    def add_fault(self, kind: str, *, count: int | None = None, status: int = 503, delay: float = 0.0,
                  path: str | None = None, method: str | None = None) -> None:
        with self._lock:
            self._faults.append(Fault(kind, count, status, delay, path, method))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def requests(self) -> int:
        with self._lock:
            return self._requests

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self._requests, "by_path": dict(self._by_path)}

    def reset(self) -> None:
        """Forget faults, counters and every notice: back to a healthy node with nothing pending."""
        with self._lock:
            self._faults.clear()
            self._requests = 0
            self._by_path.clear()
            self.reset_state()
        self._wake_waiters()

    # --- what a cloud implements -------------------------------------------
    def handle(self, request: Request) -> Response:
        raise NotImplementedError

    def reset_state(self) -> None:
        """Clear the cloud's notices (called under the lock)."""

    def preempt(self, deadline_seconds: float) -> None:
        """Deliver the notice this cloud gives a spot VM that is about to be reclaimed."""
        raise NotImplementedError

    def admin(self, op: dict[str, Any]) -> dict[str, Any]:
        """Apply one ``POST /_fake/notice`` operation; subclasses add their own ops."""
        if op.get("op") == "preempt":
            self.preempt(float(op.get("deadline_seconds", 120.0)))
            return {"ok": True}
        raise ValueError(f"unknown op {op.get('op')!r} for the {self.cloud} fake")

    def _wake_waiters(self) -> None:
        """Release requests blocked inside :meth:`handle` (hanging GETs)."""

    # --- request path ---------------------------------------------------------
    def _take_fault(self, request: Request) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(request):
                    if fault.count is not None:
                        fault.count -= 1
                        if fault.count <= 0:
                            self._faults.remove(fault)
                    return fault
        return None

    def _serve(self, request: Request) -> Response | None:
        """Answer one request; ``None``: close without answering; ``DROP``: never answer."""
        if request.path.startswith(ADMIN_PREFIX):
            return self._serve_admin(request)
        with self._lock:
            self._requests += 1
            self._by_path[request.path] = self._by_path.get(request.path, 0) + 1
        fault = self._take_fault(request)
        if fault is not None:
            if fault.kind == "drop":
                return DROP
            if fault.kind == "status":
                return Response(fault.status, b"")
            if fault.kind == "garbage":
                with self._lock:
                    self._garbage_turn += 1
                    body = GARBAGE[self._garbage_turn % len(GARBAGE)]
                return Response(200, body, {"Content-Type": "text/plain"})
            if fault.kind == "trickle":
                return dataclasses.replace(self.handle(request), trickle=fault.delay)
            if self._stopping.wait(fault.delay):  # slow
                return None
        return self.handle(request)

    def _serve_admin(self, request: Request) -> Response:
        name = request.path[len(ADMIN_PREFIX):].strip("/")
        try:
            body = json.loads(request.body or b"{}")
            if name == "stats" and request.method == "GET":
                return _json(200, self.stats())
            if request.method != "POST":
                return _json(405, {"error": f"use POST for {request.path}"})
            if name == "reset":
                self.reset()
                return _json(200, {"ok": True})
            if name == "fault":
                self.add_fault(body.pop("kind"), **body)
                return _json(200, {"ok": True})
            if name == "notice":
                return _json(200, self.admin(body))
        except (KeyError, TypeError, ValueError) as exc:
            return _json(400, {"error": f"bad admin request {request.path}: {exc}"})
        return _json(404, {"error": f"no admin endpoint {request.path}; try notice, fault, reset, stats"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up (timeouts, dropped requests) is normal here; anything else is printed."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def _json(status: int, payload: Any) -> Response:
    return Response(status, json.dumps(payload), {"Content-Type": "application/json"})


def _handler_for(server: FakeMetadataServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = server.server_header
        sys_version = ""

        def setup(self) -> None:
            super().setup()
            # headers and body leave in two writes: without this, Nagle + delayed ACK add ~40 ms
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with server._lock:
                server._connections.add(self.connection)

        def finish(self) -> None:
            with server._lock:
                server._connections.discard(self.connection)
            try:
                super().finish()
            except OSError:
                pass

        def _dispatch(self) -> None:
            if server._stopping.is_set():
                self.close_connection = True
                return
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            request = Request(self.command, parts.path or "/", dict(parse_qsl(parts.query)), self.headers, body)
            response = server._serve(request)
            if response is DROP:
                self._hold_until_client_leaves()
                response = None
            if response is None or server._stopping.is_set():
                self.close_connection = True
                return
            payload = response.encoded()
            if response.trickle:
                self._trickle(response, payload)
                return
            self.send_response(response.status)
            for key, value in response.headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _trickle(self, response: Response, payload: bytes) -> None:
            """The whole answer, one byte at a time, until it is out or the client leaves."""
            self.close_connection = True
            lines = [f"HTTP/1.1 {response.status} {self.responses.get(response.status, ('',))[0]}",
                     f"Server: {self.version_string()}", f"Content-Length: {len(payload)}", "Connection: close"]
            lines += [f"{key}: {value}" for key, value in response.headers.items()]
            data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload
            for index in range(len(data)):
                if server._stopping.wait(response.trickle):
                    return
                try:
                    self.connection.sendall(data[index:index + 1])
                except OSError:
                    return

        def _hold_until_client_leaves(self) -> None:
            """Say nothing until the client gives up (or the server stops), like a dropped packet."""
            while not server._stopping.wait(0.2):
                readable, _, _ = select.select([self.connection], [], [], 0)
                try:
                    if readable and not self.connection.recv(1, socket.MSG_PEEK):
                        return
                except OSError:
                    return

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _dispatch

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            pass

    return Handler
