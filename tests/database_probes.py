"""What tests use to watch a database from outside the code under test: the write transactions some code opens, the
sessions waiting for a lock, the round trips some code makes (Postgres)."""

from __future__ import annotations

import tempfile
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


def round_trips(db, work) -> int:
    """How many times ``work(db)`` waited for the server: the ReadyForQuery messages that end each of its round trips,
    read from libpq's protocol trace of the pool's one connection (a PostgresDatabase of ``pool_size=1``)."""
    with tempfile.TemporaryFile("w+") as trace:
        with db._pool.connection() as conn:
            conn.pgconn.trace(trace.fileno())
        try:
            work(db)
        finally:
            with db._pool.connection() as conn:
                conn.pgconn.untrace()
        trace.seek(0)
        return sum("ReadyForQuery" in line for line in trace)
