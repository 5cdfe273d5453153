"""Uploaded workdir archives kept in the database, for controllers that share one (with SQLite they stay
in files: runner/controller/workdirs.py), so a node fetches its job's workdir from whichever controller
it reaches. An archive is stored once per sha256, in chunks of 1 MiB.
"""

from __future__ import annotations

import itertools
from typing import Iterator

from .db import Database

CHUNK_BYTES = 1 << 20


class DatabaseWorkdirs:
    def __init__(self, db: Database):
        self.db = db

    def has(self, digest: str) -> bool:
        return bool(self.db.query("SELECT 1 AS x FROM workdir_chunks WHERE digest = ? AND seq = 0", (digest,)))

    def put(self, digest: str, data: bytes) -> None:
        with self.db.transaction() as tx:
            if tx.one("SELECT 1 AS x FROM workdir_chunks WHERE digest = ? AND seq = 0", (digest,)):
                return
            for seq, start in enumerate(range(0, max(len(data), 1), CHUNK_BYTES)):
                tx.execute("INSERT INTO workdir_chunks (digest, seq, data) VALUES (?, ?, ?)",
                           (digest, seq, bytes(data[start:start + CHUNK_BYTES])))

    def stream(self, digest: str) -> Iterator[bytes]:
        """The archive chunk by chunk (one query each, so a large one is never held whole)."""
        for seq in itertools.count():
            rows = self.db.query("SELECT data FROM workdir_chunks WHERE digest = ? AND seq = ?", (digest, seq))
            if not rows:
                return
            yield bytes(rows[0]["data"])
