"""The control socket's framing, for both ends (the agent serves it, the training library connects).

Transport: a Unix stream socket whose path is in ``RUNNER_CONTROL``. Framing: newline-delimited JSON, one UTF-8
JSON object per line, each with a string ``op`` (messages.py says which). A receiver passes over a line that is
not such an object.
"""

from __future__ import annotations

import json
import socket
from typing import Callable

RECEIVE_BYTES = 65536


def encode(message: dict) -> bytes:
    """One protocol line."""
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes | str) -> dict | None:
    """Parse one protocol line; None when it is not a JSON object with an ``op``."""
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return message if isinstance(message, dict) and isinstance(message.get("op"), str) else None


def read_messages(sock: socket.socket, on_message: Callable[[dict], None],
                  on_invalid: Callable[[bytes], None] | None = None) -> None:
    """Hand every message that arrives on ``sock`` to ``on_message``, in order, until the connection ends (by
    the peer, or by an error); a non-empty line that is not a message goes to ``on_invalid``."""
    pending = b""
    while True:
        try:
            data = sock.recv(RECEIVE_BYTES)
        except OSError:
            return
        if not data:
            return
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            message = decode(line)
            if message is not None:
                on_message(message)
            elif on_invalid is not None:
                on_invalid(line)
