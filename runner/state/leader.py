"""Which controller leads (runs the scheduler and reconciler), chosen through the database.

On Postgres the leader holds a session-level advisory lock on a connection of its own: the lock lasts as
long as that session, so when the leader's process dies its connection closes and the lock is free at once
(a leader cut off by the network loses it once TCP keepalives give up on it, about 10 s). A controller on
SQLite is the only one of its database (the data dir's lock file makes sure) and always leads.
"""

from __future__ import annotations

import structlog

from .db import LEADER_LOCK_KEY, Database

log = structlog.get_logger(__name__)


class Leadership:
    def __init__(self, db: Database):
        self.db = db
        self._conn = None

    def try_acquire(self) -> bool:
        """Become the leader if no one is; True when this controller leads now."""
        if not self.db.shared:
            return True
        if self._conn is not None:
            return self.held()
        try:
            conn = self.db.connect()
            for setting in ("tcp_keepalives_idle = 5", "tcp_keepalives_interval = 2", "tcp_keepalives_count = 3"):
                conn.execute(f"SET {setting}")
            got = conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (LEADER_LOCK_KEY,)).fetchone()["ok"]
        except Exception as exc:  # the database is away: not the leader; the caller tries again
            log.warning("leader election: database unreachable", error=str(exc))
            return False
        if got:
            self._conn = conn
        else:
            conn.close()
        return bool(got)

    def held(self) -> bool:
        """Is the lock still ours (is its session still alive)?"""
        if not self.db.shared:
            return True
        if self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1")
            return True
        except Exception as exc:
            log.warning("leader lock connection lost", error=str(exc))
            self.release()
            return False

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()  # ends the session, which frees the lock
            except Exception:
                pass
