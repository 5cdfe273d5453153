"""Which controller leads (runs the scheduler and reconciler), chosen through the database.

On Postgres the leader holds a session-level advisory lock on a connection of its own: the lock lasts as
long as that session, so when the leader's process dies its connection closes and the lock is free at once
(a leader cut off by the network loses it once TCP keepalives give up on it, about 10 s). A controller on
SQLite is the only one of its database (the data dir's lock file makes sure) and always leads.

The leader also LISTENs on that connection: a controller that records work for the reconciler (a submit, a cancel,
an exit report) while another leads wakes the leader's reconciler with a NOTIFY (:func:`wake_leader`), rather than
leaving the work to its next tick.
"""

from __future__ import annotations

import structlog

from .db import LEADER_LOCK_KEY, Database

log = structlog.get_logger(__name__)

WAKE_CHANNEL = "runner_reconciler"


def wake_leader(db: Database) -> None:
    """Wake the leading controller's reconciler (on Postgres; sent when the caller's transaction, if any, commits)."""
    if db.shared:
        db.query(f"SELECT pg_notify('{WAKE_CHANNEL}', '')")


class Leadership:
    def __init__(self, db: Database):
        self.db = db
        self._conn = None  # the leader's: it holds the lock
        self._candidate = None  # a follower's, kept between its tries for the lock (not a new one every second)
        self._deaf = False  # waiting for wakes failed: until the next held() looks at the connection

    def try_acquire(self) -> bool:
        """Become the leader if no one is; True when this controller leads now."""
        if not self.db.shared:
            return True
        if self._conn is not None:
            return self.held()
        conn, self._candidate = self._candidate, None
        try:
            if conn is None:
                conn = self._connect()
            got = conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (LEADER_LOCK_KEY,)).fetchone()["ok"]
            if got:
                conn.execute(f"LISTEN {WAKE_CHANNEL}")
        except Exception as exc:  # the database is away: not the leader; the caller tries again
            log.warning("leader election: database unreachable", error=str(exc))
            _close(conn)  # ends its session, and any lock it took
            return False
        if got:
            self._conn = conn
        else:
            self._candidate = conn
        return bool(got)

    def _connect(self):
        conn = self.db.connect()
        for setting in ("tcp_keepalives_idle = 5", "tcp_keepalives_interval = 2", "tcp_keepalives_count = 3"):
            conn.execute(f"SET {setting}")
        return conn

    def held(self) -> bool:
        """Is the lock still ours (is its session still alive)?"""
        if not self.db.shared:
            return True
        if self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1")
            self._deaf = False
            return True
        except Exception as exc:
            log.warning("leader lock connection lost", error=str(exc))
            self.release()
            return False

    @property
    def listening(self) -> bool:
        """Does this controller lead on a connection that hears wakes (Postgres)?"""
        return self._conn is not None and not self._deaf

    def wait_for_wake(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds on the lock's connection for a :func:`wake_leader`; True when one came. A
        lost connection returns False at once, and :attr:`listening` is False until the next :meth:`held`."""
        if self._conn is None:
            return False
        try:
            for _ in self._conn.notifies(timeout=timeout, stop_after=1):
                return True
        except Exception as exc:
            log.warning("leader lock connection: waiting for wakes failed", error=str(exc))
            self._deaf = True
        return False

    def release(self) -> None:
        """Give up the lock (ending its session frees it) and the follower's connection."""
        conn, self._conn, self._deaf = self._conn, None, False
        candidate, self._candidate = self._candidate, None
        _close(conn)
        _close(candidate)


def _close(conn) -> None:
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass
