"""What tests use to watch a database from outside the code under test: the write transactions some code opens, and
the sessions waiting for a lock (Postgres)."""

from __future__ import annotations

import time


class CountingTransactions:
    """The store's database, counting the write transactions opened through it."""

    def __init__(self, db):
        self.db, self.count = db, 0

    def transaction(self, **kwargs):
        self.count += 1
        return self.db.transaction(**kwargs)

    def __getattr__(self, name):
        return getattr(self.db, name)


def waiting_for_a_lock(db) -> int:
    """How many sessions wait for a lock another holds (seen from a connection outside the pool)."""
    with db.connect() as conn:
        return conn.execute("SELECT COUNT(*) AS n FROM pg_locks WHERE NOT granted").fetchone()["n"]


def until(condition, what: str, timeout: float = 60) -> None:
    """Wait for ``condition()`` (an overall bound, never an expected duration)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
