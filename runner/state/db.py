"""Database connections: SQLite in WAL mode by default.

Everything above this module speaks through :class:`Database` (``transaction()``, ``query()``), so a
Postgres implementation can slot in behind the same two methods.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .migrations import apply_migrations


class DatabaseError(Exception):
    """The database cannot be opened or used; the message names the URL and the fix."""


def open_database(url: str) -> "Database":
    """Open a database by URL: ``sqlite:///path/to/file.db`` (Postgres: not yet)."""
    if url.startswith("sqlite:///"):
        return SQLiteDatabase(Path(url.removeprefix("sqlite:///")))
    if url.startswith(("postgres://", "postgresql://")):
        raise DatabaseError(f"{url.split('@')[-1]}: Postgres support is not built yet; use sqlite:///PATH")
    raise DatabaseError(f"--db {url!r}: unknown database URL; use sqlite:///PATH")


class Database:
    """The data-access seam: a transaction context and read queries, both yielding dict rows."""

    def transaction(self):  # pragma: no cover - interface
        raise NotImplementedError

    def query(self, sql: str, params: tuple = ()) -> list[dict]:  # pragma: no cover - interface
        raise NotImplementedError


class SQLiteDatabase(Database):
    """SQLite with WAL, one connection per thread, ``BEGIN IMMEDIATE`` writes."""

    def __init__(self, path: Path):
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseError(f"cannot create {path.parent}: {exc.strerror}") from None
        self._local = threading.local()
        # This process's writers queue here, woken the moment the writer before them commits. Left to SQLite's
        # busy handler they would poll, sleeping up to 100 ms between tries, and with many threads writing that
        # sleep, not the write, is what an API request waits for.
        self._write_lock = threading.RLock()
        conn = self._connection()
        conn.execute("PRAGMA journal_mode=WAL")
        apply_migrations(conn)

    def _connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            except sqlite3.Error as exc:
                raise DatabaseError(f"cannot open {self.path}: {exc}") from None
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.conn = conn
        return conn

    @contextmanager
    def transaction(self) -> Iterator["Tx"]:
        conn = self._connection()
        with self._write_lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield Tx(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def query(self, sql: str, params: tuple = ()) -> list[dict]:
        return [dict(row) for row in self._connection().execute(sql, params)]


class Tx:
    """A transaction in progress: ``execute`` for writes, ``one``/``all`` for reads."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn

    def execute(self, sql: str, params: tuple = ()) -> int:
        return self._conn.execute(sql, params).rowcount

    def one(self, sql: str, params: tuple = ()) -> dict | None:
        row = self._conn.execute(sql, params).fetchone()
        return dict(row) if row else None

    def all(self, sql: str, params: tuple = ()) -> list[dict]:
        return [dict(row) for row in self._conn.execute(sql, params)]
