"""The agent's end of the control channel: a Unix socket the training library connects to.

Newline-delimited JSON, read and written by runner/protocol/framing.py (the messages: runner/protocol/messages.py,
their meaning to the library: runner/checkpoint/control.py). The agent sends
``checkpoint`` requests; the library reports ``hello``, ``restored``, ``committed``, ``stopping`` and, from
``Checkpointer.close()``, ``closed`` (a library that predates it never sends it).
A connection counts as a training process once it has said ``hello``; others (a health check that
connects and leaves) are served the same way but never counted. Under torchrun every rank connects; a
message that does not say which rank sent it gets ``rank`` and ``local_rank`` from its connection's hello.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Callable

import structlog

from runner.protocol.framing import encode, read_messages
from runner.protocol.messages import Op

log = structlog.get_logger(__name__)


class ControlServer:
    def __init__(self, path: Path, on_message: Callable[[dict], None]):
        self.path = path
        self.on_message = on_message
        self._clients: dict[socket.socket, dict | None] = {}  # connection -> its hello, once said
        self._closed: set[socket.socket] = set()  # connections whose Checkpointer has said ``closed``
        self._readers: list[threading.Thread] = []  # one per open connection; each removes itself when done
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.connected = threading.Event()
        self.hellos = 0           # training processes that have connected (ever)
        self.closed_and_gone = 0  # ... and of those, the ones that closed their Checkpointer and disconnected

    def start(self) -> "ControlServer":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._sock.listen(8)
        threading.Thread(target=self._accept, name="control-accept", daemon=True).start()
        return self

    def trainees(self) -> list[dict]:
        """The ``hello`` of every training process connected now."""
        with self._lock:
            return [hello for hello in self._clients.values() if hello is not None]

    def training(self) -> list[dict]:
        """The ``hello`` of every training process connected now that has not closed its Checkpointer."""
        with self._lock:
            return [hello for conn, hello in self._clients.items() if hello is not None and conn not in self._closed]

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._open(conn)

    def _open(self, conn: socket.socket) -> None:
        reader = threading.Thread(target=self._read, args=(conn,), name="control-read", daemon=True)
        with self._lock:
            self._clients[conn] = None
            self._readers.append(reader)
        self.connected.set()
        reader.start()

    def _read(self, conn: socket.socket) -> None:
        try:
            self._serve(conn)
        finally:
            with self._lock:
                hello = self._clients.pop(conn, None)
                if hello is not None and conn in self._closed:
                    self.closed_and_gone += 1
                self._closed.discard(conn)
                self._readers.remove(threading.current_thread())
            conn.close()
            if hello is not None:
                log.info("training process disconnected", pid=hello.get("pid"))

    def _serve(self, conn: socket.socket) -> None:
        read_messages(conn, lambda message: self._received(conn, message), on_invalid=self._not_a_message)

    @staticmethod
    def _not_a_message(line: bytes) -> None:
        log.warning("control channel: not a message", line=line[:200])

    def _received(self, conn: socket.socket, message: dict) -> None:
        if message["op"] == Op.HELLO:
            self._hello(conn, message)
        else:
            if message["op"] == Op.CLOSED:
                with self._lock:
                    self._closed.add(conn)
            message = self._with_sender(conn, message)
        try:
            self.on_message(message)
        except Exception:
            log.exception("control message handler failed", message=message)

    def _hello(self, conn: socket.socket, message: dict) -> None:
        with self._lock:
            if conn in self._clients:
                if self._clients[conn] is None:
                    self.hellos += 1
                self._clients[conn] = message
        log.info("training process connected", pid=message.get("pid"), job=message.get("job_id"),
                 attempt=message.get("attempt"))

    def _with_sender(self, conn: socket.socket, message: dict) -> dict:
        with self._lock:
            hello = self._clients.get(conn) or {}
        sender = {k: hello.get(k) for k in ("rank", "local_rank", "pid") if k not in message and k in hello}
        return {**message, **sender} if sender else message

    def counts(self) -> tuple[int, int]:
        """(training processes connected ever, those that closed their Checkpointer and then disconnected)."""
        with self._lock:
            return self.hellos, self.closed_and_gone

    def send(self, message: dict) -> int:
        """Send to every connection; return how many training processes (connections that said hello) got it."""
        data = encode(message)
        sent = 0
        with self._lock:
            for conn, hello in list(self._clients.items()):
                try:
                    conn.sendall(data)
                except OSError:
                    continue  # its reader sees the connection end and drops it
                if hello is not None:
                    sent += 1
        return sent

    def drain(self, timeout: float = 5.0) -> None:
        """Wait until every message the (exited) training process sent has been handled."""
        with self._lock:
            readers = list(self._readers)
        for reader in readers:
            reader.join(timeout)

    def close(self) -> None:
        if self._sock:
            self._sock.close()
        with self._lock:
            for conn in self._clients:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self.path.unlink(missing_ok=True)
