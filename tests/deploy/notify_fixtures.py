"""A service manager's end of sd_notify (a real datagram socket), and a loopback stand-in for the agent API."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class NotifySocket:
    """Binds ``address`` (a path, or bytes starting with NUL for an abstract one) and records every datagram."""

    def __init__(self, address: str | bytes):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []  # (monotonic time received, datagram)
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._closed.is_set():
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            with self._changed:
                self.messages.append((time.monotonic(), data.decode()))
                self._changed.notify_all()

    def wait_for(self, text: str, count: int = 1, timeout: float = 30.0) -> float:
        """Block until ``text`` has arrived ``count`` times; return when the last of them arrived."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                arrivals = [at for at, message in self.messages if message == text]
                if len(arrivals) >= count:
                    return arrivals[count - 1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{text!r} x{count} not received; got {[m for _, m in self.messages]}")
                self._changed.wait(left)

    def received(self, text: str) -> int:
        with self._changed:
            return sum(1 for _, message in self.messages if message == text)

    def close(self) -> None:
        self._closed.set()
        self.sock.close()
        self._thread.join(1)


class FakeAgentAPI:
    """The controller's agent endpoints, enough for one attempt of ``run``; records when each call was answered."""

    def __init__(self, token: str, assignment: dict):
        self.token = token
        self.assignment = assignment
        self.answered: dict[str, float] = {}  # path -> monotonic time of the first successful answer
        self.posted: list[tuple[str, dict]] = []  # (path, body) of every authorised POST, in order
        self.output = bytearray()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _reply(self, path: str, body: dict) -> dict | None:
        if path == "/v1/agent/register":
            return self.assignment
        if path == "/v1/agent/logs/offset":
            return {"offset": len(self.output)}
        if path == "/v1/agent/logs":
            if body["offset"] == len(self.output):
                self.output += base64.b64decode(body["data_b64"])
            return {"offset": len(self.output)}
        if path == "/v1/agent/heartbeat":
            return {"action": "continue"}
        if path == "/v1/agent/events":
            return {"accepted": True}
        if path == "/v1/agent/exit":
            return {"state": "SUCCEEDED" if body.get("reason") == "succeeded" else "FAILED"}
        return None

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, body: dict) -> None:
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    return self._send(401, {"detail": "bad token"})
                if self.command == "POST":
                    api.posted.append((self.path, body))
                reply = api._reply(self.path, body)
                if reply is None:
                    return self._send(404, {"detail": f"no route {self.path}"})
                api.answered.setdefault(self.path, time.monotonic())  # before the agent can act on it
                self._send(200, reply)

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._serve({})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                self._serve(json.loads(self.rfile.read(length) or b"{}"))

            def log_message(self, *args):
                pass

        return Handler

    def bodies(self, path: str) -> list[dict]:
        """The body of every POST to ``path`` so far."""
        return [body for posted, body in list(self.posted) if posted == path]

    def wait_for(self, path: str, timeout: float = 30.0) -> dict:
        """The first POST to ``path``, waiting for it up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.bodies(path):
            if time.monotonic() > deadline:
                raise AssertionError(f"no POST to {path}; got {[p for p, _ in self.posted]}")
            time.sleep(0.05)
        return self.bodies(path)[0]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def assignment(run: str, checkpoint_url: Path) -> dict:
    """What the controller's register endpoint answers for a first attempt with no workdir and no drill."""
    return {
        "job_id": "j-notify", "attempt": 1, "name": "notify", "setup": None, "run": run, "env": {},
        "has_workdir": False,
        "checkpoint": {"local_dir": None, "durable_url": checkpoint_url.as_uri(), "interval": "auto", "keep": 3,
                       "resume": None},
        "resume_drill_seconds": None,
    }
