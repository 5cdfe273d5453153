"""Job output, one append-only file per attempt (and per node of a multi-node job), at exact byte offsets.

An agent sends each chunk with the offset it starts at; a chunk that was already received (a retry
after a lost reply) is not written twice, and a gap is refused so the agent resends from the end.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


class LogStore:
    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()

    def path(self, job_id: str, attempt: int, node: int = 0) -> Path:
        """Node 0's output (and a single node's) is ``attempt-N.log``; node R's of a gang ``attempt-N.node-R.log``."""
        return self.root / job_id / (f"attempt-{attempt}.log" if node == 0 else f"attempt-{attempt}.node-{node}.log")

    def size(self, job_id: str, attempt: int, node: int = 0) -> int:
        try:
            return self.path(job_id, attempt, node).stat().st_size
        except FileNotFoundError:
            return 0

    def append(self, job_id: str, attempt: int, offset: int, data: bytes, node: int = 0) -> int:
        """Write ``data`` that starts at ``offset``; return the new size (the offset to send next)."""
        with self._lock:
            path = self.path(job_id, attempt, node)
            path.parent.mkdir(parents=True, exist_ok=True)
            size = self.size(job_id, attempt, node)
            if offset > size:
                return size  # a gap: the agent resends from here
            new = data[size - offset:]
            if new:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                try:
                    os.write(fd, new)
                finally:
                    os.close(fd)
            return max(size, offset + len(data))

    def read(self, job_id: str, attempt: int, offset: int = 0, limit: int = 1 << 20, node: int = 0) -> bytes:
        try:
            with open(self.path(job_id, attempt, node), "rb") as handle:
                handle.seek(offset)
                return handle.read(limit)
        except FileNotFoundError:
            return b""
