"""Rendezvous ports of the simulated nodes, held for them until they listen.

On a cloud, node 0's rendezvous port is on its own machine. Here every node is this machine, which the controller,
the agents, every training process and anything else running share, and a port found free now can be taken by
any outgoing connection before the node's launcher listens on it: seconds later on a busy machine (its Python
and torch to import), and the launcher then fails with EADDRINUSE, a failure of the job's own. Where the machine
hands out ephemeral ports from almost the whole range, no choice of port avoids that.

So the port is held: a socket bound to it with ``SO_REUSEADDR`` and never listening. The kernel then gives the
port to no other ``bind(port 0)`` or outgoing connection, while a listener that sets ``SO_REUSEADDR`` itself (as
torch's TCPStore does, in torchrun and in an elastic world's store) can still bind and listen on it. A hold ends
after ``HOLD_SECONDS`` (longer than a gang gets to form) or when more than ``MAX_HELD`` are held, oldest first.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import OrderedDict

HOLD_SECONDS = 30 * 60.0
MAX_HELD = 256


class HeldPorts:
    """Free ports of ``address``, each held against other takers until its hold ends."""

    def __init__(self, address: str, hold_seconds: float = HOLD_SECONDS, max_held: int = MAX_HELD) -> None:
        self.address = address
        self.hold_seconds = hold_seconds
        self.max_held = max_held
        self._held: OrderedDict[int, tuple[socket.socket, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, avoid: int | None = None) -> int:
        """A port free now, other than ``avoid``, held from this moment."""
        with self._lock:
            self._release_expired(time.monotonic())
            while True:
                holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                holder.bind((self.address, 0))
                port = holder.getsockname()[1]
                if port != avoid:
                    break
                holder.close()
            self._held[port] = (holder, time.monotonic())
            while len(self._held) > self.max_held:
                self._held.popitem(last=False)[1][0].close()
            return port

    def held(self) -> list[int]:
        with self._lock:
            return list(self._held)

    def close(self) -> None:
        with self._lock:
            while self._held:
                self._held.popitem(last=False)[1][0].close()

    def _release_expired(self, now: float) -> None:
        while self._held:
            port, (holder, since) = next(iter(self._held.items()))
            if now - since < self.hold_seconds:
                return
            holder.close()
            del self._held[port]
