"""The agent's end of the control channel: a Unix socket the training library connects to.

Newline-delimited JSON (the protocol is described in runner/checkpoint/control.py). The agent sends
``checkpoint`` requests; the library reports ``hello``, ``restored``, ``committed`` and ``stopping``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Callable

import structlog

log = structlog.get_logger(__name__)


class ControlServer:
    def __init__(self, path: Path, on_message: Callable[[dict], None]):
        self.path = path
        self.on_message = on_message
        self._clients: list[socket.socket] = []
        self._readers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.connected = threading.Event()

    def start(self) -> "ControlServer":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._sock.listen(8)
        threading.Thread(target=self._accept, name="control-accept", daemon=True).start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._clients.append(conn)
            self.connected.set()
            reader = threading.Thread(target=self._read, args=(conn,), name="control-read", daemon=True)
            self._readers.append(reader)
            reader.start()

    def _read(self, conn: socket.socket) -> None:
        buffer = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                with self._lock:
                    if conn in self._clients:
                        self._clients.remove(conn)
                return
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:
                    log.warning("control channel: not JSON", line=line[:200])
                    continue
                try:
                    self.on_message(message)
                except Exception:
                    log.exception("control message handler failed", message=message)

    def send(self, message: dict) -> int:
        """Send to every connected training process; return how many got it."""
        data = (json.dumps(message) + "\n").encode()
        sent = 0
        with self._lock:
            for conn in list(self._clients):
                try:
                    conn.sendall(data)
                    sent += 1
                except OSError:
                    self._clients.remove(conn)
        return sent

    def drain(self, timeout: float = 5.0) -> None:
        """Wait until every message the (exited) training process sent has been handled."""
        for reader in list(self._readers):
            reader.join(timeout)

    def close(self) -> None:
        if self._sock:
            self._sock.close()
        with self._lock:
            for conn in self._clients:
                conn.close()
            self._clients.clear()
        self.path.unlink(missing_ok=True)
