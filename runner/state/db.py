"""Database connections: SQLite in WAL mode by default, Postgres (psycopg 3) for teams.

Everything above this module speaks through :class:`Database` (``transaction()``, ``query()``) in portable
SQL; :mod:`.dialect` rewrites it for Postgres. Write transactions are serialised on both: SQLite's
``BEGIN IMMEDIATE`` takes its single write lock, and on Postgres every write transaction first takes one
transaction-scoped advisory lock, so the store's read-then-write steps see the same isolation on either.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import unquote, urlsplit

import structlog

from .dialect import to_postgres
from .errors import DatabaseError, DatabaseUnreachable, UnsupportedDatabaseURL
from .migrations import apply_migrations
from ..protocol.urls import hide_secrets, redact

# Advisory lock keys (any 64-bit numbers, fixed): the write lock and the leader's lock.
WRITE_LOCK_KEY = 0x72756E6E6572_01
LEADER_LOCK_KEY = 0x72756E6E6572_02
CONNECT_TIMEOUT_SECONDS = 10
POOL_SIZE = 8  # pooled connections of one controller to Postgres
# How long a request waits for a pooled connection: while the database answers, as long as a busy pool may take
# (POOL_WAIT_SECONDS); once it is known to be out of reach, only long enough for the new connection that the
# request's wait starts to be made, where the database is back (AWAY_WAIT_SECONDS). Every other request of an
# outage is then answered in about that time, not after the whole pool timeout.
POOL_WAIT_SECONDS = 30.0
AWAY_WAIT_SECONDS = 1.0
# The pool's own retries of a lost connection stop after this (psycopg_pool's default retries for 5 minutes,
# waiting twice as long each time, so a database back after a minute was found a minute later again); after
# that a request that finds the pool empty starts a new connection at once.
RECONNECT_SECONDS = 5.0

log = structlog.get_logger(__name__)


def padded(values: list) -> list:
    """``values`` with its last item repeated up to the next power of two: a statement with a list of ``?`` of
    that length is one of a few texts, so the driver's prepared statements are reused (planned once per
    connection, not at every call) whatever the count. For lists whose repeats change nothing (``IN``, a
    ``VALUES`` list read into a dict)."""
    size = 1
    while size < len(values):
        size *= 2
    return list(values) + [values[-1]] * (size - len(values)) if values else list(values)


def open_database(url: str, migrate: bool = True) -> "Database":
    """Open a database by URL: ``sqlite:///path/to/file.db`` or ``postgresql://USER:PASS@HOST:PORT/DB``.

    ``migrate``: bring the schema up to date (a schema newer than this runner's is refused either way)."""
    if url.startswith("sqlite:///"):
        db: Database = SQLiteDatabase(Path(url.removeprefix("sqlite:///")))
    elif url.startswith(("postgres://", "postgresql://")):
        db = PostgresDatabase(url)
    else:
        raise UnsupportedDatabaseURL(f"--db {redact(url)!r}: unsupported database URL; the supported schemes are "
                                     "sqlite:///PATH and postgresql://USER:PASSWORD@HOST:PORT/DATABASE "
                                     "(or postgres://)")
    try:
        apply_migrations(db, apply=migrate)
    except BaseException:
        db.close()
        raise
    return db


class Database:
    """The data-access seam: a transaction context and read queries, both yielding dict rows."""

    kind = ""
    shared = False  # may several controllers use it at once?
    unreachable = False  # is it known to be out of reach (a server's database: PostgresDatabase)?

    def transaction(self, serialized: bool = True):  # pragma: no cover - interface
        """A write transaction. ``serialized`` (the default): one at a time across every controller, so a
        read-then-write step sees no other writer. Pass False only for writes that guard themselves (a
        unique key that makes a racing duplicate fail harmlessly): on Postgres they then run concurrently."""
        raise NotImplementedError

    def query(self, sql: str, params: tuple = ()) -> list[dict]:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class Tx:
    """A transaction in progress: ``execute`` for writes, ``one``/``all`` for reads."""

    def __init__(self, conn, translate: Callable[[str], str] = str):
        self._conn = conn
        self._translate = translate

    def execute(self, sql: str, params: tuple = ()) -> int:
        return self._conn.execute(self._translate(sql), params).rowcount

    def execute_many(self, sql: str, rows: list[tuple]) -> None:
        """One statement for many rows, looped in the driver: no Python between rows while the write lock is held."""
        self._conn.cursor().executemany(self._translate(sql), rows)

    def one(self, sql: str, params: tuple = ()) -> dict | None:
        row = self._conn.execute(self._translate(sql), params).fetchone()
        return dict(row) if row else None

    def all(self, sql: str, params: tuple = ()) -> list[dict]:
        return [dict(row) for row in self._conn.execute(self._translate(sql), params)]

    @contextmanager
    def savepoint(self) -> Iterator["Tx"]:
        """A part of the transaction that an exception undoes on its own, leaving the rest to commit."""
        self._conn.execute("SAVEPOINT part")
        try:
            yield self
        except BaseException:
            self._conn.execute("ROLLBACK TO SAVEPOINT part")
            self._conn.execute("RELEASE SAVEPOINT part")
            raise
        self._conn.execute("RELEASE SAVEPOINT part")

    def all_in_savepoint(self, sql: str, params: tuple = ()) -> list[dict]:
        """``all`` in a savepoint of its own: the statement's rows, or its error with nothing of it kept (the
        transaction goes on)."""
        with self.savepoint():
            return self.all(sql, params)

    def all_in_savepoint_then_commit(self, sql: str, params: tuple = ()) -> list[dict]:
        """``all_in_savepoint`` as the transaction's last statement: nothing may follow it. On Postgres its COMMIT goes
        out with it, in the same round trip (``committed`` then says so); elsewhere the transaction commits as usual,
        when its context ends. Where the statement fails, its error is raised with nothing of it kept and the
        transaction goes on uncommitted, as after ``all_in_savepoint``; where the COMMIT fails, nothing of the
        transaction is kept, and every later statement and the transaction's end raise that error."""
        return self.all_in_savepoint(sql, params)

    @property
    def committed(self) -> bool:
        """Whether the transaction already committed (with ``all_in_savepoint_then_commit``'s statement)."""
        return False


class PostgresTx(Tx):
    """A transaction on Postgres, where every statement is a round trip. ``pipelines``: whether the driver's libpq
    has pipeline mode (libpq 14 and later; psycopg's binary wheels bring it)."""

    def __init__(self, conn, translate: Callable[[str], str], pipelines: bool, begin: tuple[str, ...]):
        super().__init__(_BeginsWithFirstStatement(conn, begin, pipelines), translate)
        self._pipelines = pipelines

    def all_in_savepoint(self, sql: str, params: tuple = ()) -> list[dict]:
        """The savepoint, the statement and the release in one round trip (psycopg's pipeline mode)."""
        if not self._pipelines:
            return super().all_in_savepoint(sql, params)
        try:
            with self._conn.pipeline():
                self._conn.execute("SAVEPOINT part")
                cursor = self._conn.execute(self._translate(sql), params)
                self._conn.execute("RELEASE SAVEPOINT part")
        except BaseException as exc:  # raised as the pipeline ends: the release was skipped, the savepoint is there
            self._undo_savepoint(exc)
            raise
        return [dict(row) for row in cursor.fetchall()]

    def _undo_savepoint(self, failure: BaseException) -> None:
        """After the statement of a pipelined savepoint failed: undo it alone, in one round trip, the transaction
        going on. Where that fails too (BEGIN, the lock or the SAVEPOINT itself had failed: there is no savepoint),
        the transaction is lost whole, and the error raised is the first one, not the undo's."""
        try:
            self._conn.execute("ROLLBACK TO SAVEPOINT part; RELEASE SAVEPOINT part")
        except Exception:  # noqa: BLE001 - the transaction is aborted; its end rolls it back
            raise failure from None

    def all_in_savepoint_then_commit(self, sql: str, params: tuple = ()) -> list[dict]:
        """The savepoint, the statement and COMMIT in one round trip (with BEGIN and the lock, where nothing was sent
        before). A statement that fails stops the pipeline before the COMMIT: its savepoint is rolled back, the
        transaction stays open for what the caller does instead."""
        if not self._pipelines:
            return super().all_in_savepoint_then_commit(sql, params)
        try:
            with self._conn.pipeline():
                self._conn.execute("SAVEPOINT part")
                cursor = self._conn.execute(self._translate(sql), params)
                self._conn.execute("COMMIT")
        except BaseException as exc:
            if not self._conn.in_failed_transaction():  # the COMMIT failed, or the connection: nothing was kept
                self._conn.ended(exc)
                raise
            self._undo_savepoint(exc)  # the statement failed (the COMMIT was skipped)
            raise
        self._conn.ended()
        return [dict(row) for row in cursor.fetchall()]

    @property
    def committed(self) -> bool:
        return self._conn.committed


class TransactionEnded(DatabaseError):
    """A statement sent after its transaction committed (with its last statement) or failed to commit."""


class _BeginsWithFirstStatement:
    """A connection whose transaction's BEGIN (and write lock) goes out with its first statement, in one round trip
    (pipeline mode), not in one of its own: a transaction of three statements then costs four round trips with its
    COMMIT, not five. A transaction that sends nothing begins nothing (``begun``)."""

    def __init__(self, conn, begin: tuple[str, ...], pipelines: bool):
        self._conn = conn
        self._begin = begin
        self._pipelines = pipelines
        self._in_pipeline = False
        self.begun = False
        self.committed = False
        self.commit_failed: BaseException | None = None  # the error of a COMMIT sent with the last statement

    def ended(self, failure: BaseException | None = None) -> None:
        """The transaction committed (``failure`` None) or its COMMIT failed: no statement may follow."""
        self.committed, self.commit_failed = failure is None, failure

    def in_failed_transaction(self) -> bool:
        """Whether a statement of the open transaction failed (the transaction is still open, aborted)."""
        from psycopg.pq import TransactionStatus

        return self._conn.info.transaction_status == TransactionStatus.INERROR

    def _check_open(self) -> None:
        if self.committed:
            raise TransactionEnded("this transaction already committed with its last statement; nothing may follow")
        if self.commit_failed is not None:
            raise TransactionEnded(f"this transaction's commit failed and nothing of it was stored "
                                   f"({type(self.commit_failed).__name__}: {self.commit_failed})")

    def execute(self, sql: str, params: tuple | None = None):
        self._check_open()
        if self.begun:
            return self._conn.execute(sql, params)
        self.begun = True
        if not self._pipelines:  # BEGIN and the lock as one simple query, then the statement
            self._conn.execute("; ".join(self._begin))
            return self._conn.execute(sql, params)
        with nullcontext() if self._in_pipeline else self._conn.pipeline():  # (inside one, it goes with the rest)
            for statement in self._begin:
                self._conn.execute(statement)
            cursor = self._conn.execute(sql, params)
        return cursor

    def cursor(self):  # for executemany, which cannot share a pipeline with BEGIN: BEGIN goes alone first
        self._check_open()
        if not self.begun:
            self.begun = True
            self._conn.execute("; ".join(self._begin))  # one simple query, one round trip
        return self._conn.cursor()

    @contextmanager
    def pipeline(self):
        with self._conn.pipeline():
            self._in_pipeline = True
            try:
                yield
            finally:
                self._in_pipeline = False


class SQLiteDatabase(Database):
    """SQLite with WAL, one connection per thread, ``BEGIN IMMEDIATE`` writes."""

    kind = "sqlite"

    def __init__(self, path: Path):
        self.path = path
        self.url = f"sqlite:///{path}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseError(f"cannot create {path.parent}: {exc.strerror}") from None
        self._local = threading.local()
        # This process's writers queue here, woken the moment the writer before them commits. Left to SQLite's
        # busy handler they would poll, sleeping up to 100 ms between tries, and with many threads writing that
        # sleep, not the write, is what an API request waits for.
        self._write_lock = threading.RLock()
        self._connection().execute("PRAGMA journal_mode=WAL")

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
    def transaction(self, serialized: bool = True) -> Iterator[Tx]:  # SQLite has one writer at a time anyway
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


class PostgresDatabase(Database):
    """Postgres through psycopg 3 and a small connection pool; every controller of a team shares it."""

    kind = "postgres"
    shared = True

    def __init__(self, url: str, pool_size: int = POOL_SIZE, pool_timeout: float = POOL_WAIT_SECONDS):
        try:
            import psycopg
            from psycopg.rows import dict_row
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise DatabaseError(f"{redact(url)}: Postgres needs psycopg ({exc}); pip install 'spot-runner[postgres]'") from None
        self.url = url
        self.where = postgres_location(url)
        self._psycopg = psycopg
        self._pipelines = psycopg.Pipeline.is_supported()
        self._options = dict(row_factory=dict_row, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                             **KEEPALIVES)
        self.connect().close()  # fail now, naming host and port, rather than in the pool's background thread
        self._held = threading.local()  # the connection of this thread's open transaction, if any
        self._away: str | None = None  # why the database is out of reach, from the first failure; None while it answers
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, kwargs=self._options, open=False,
                                    name="runner", configure=_configure, timeout=pool_timeout,
                                    reconnect_timeout=RECONNECT_SECONDS, reconnect_failed=self._reconnecting_failed)
        self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_SECONDS)

    @property
    def unreachable(self) -> bool:
        """Whether the database is known to be out of reach (its last use failed for want of a connection)."""
        return self._away is not None

    def connect(self):
        """A new connection of its own (autocommit, dict rows), e.g. to hold the leader's lock."""
        try:
            conn = self._psycopg.connect(self.url, **self._options)
        except self._psycopg.Error as exc:
            raise DatabaseUnreachable(f"cannot connect to Postgres at {self.where}: {_reason(exc, self.url)}; "
                                      "check the host, port, user, password and database of --db") from None
        _configure(conn)
        return conn

    # A thread holds at most one pooled connection. A transaction that asked the pool for a second one could wait
    # forever: when every other pooled connection belongs to a writer waiting for the write lock this transaction
    # holds (2,000 nodes' requests keep the pool full), the second never comes. So a read made while the thread's
    # transaction is open runs on that transaction's connection, seeing its writes, as on SQLite (one connection a
    # thread), and a transaction inside a transaction is refused, as SQLite refuses it.
    @contextmanager
    def transaction(self, serialized: bool = True) -> Iterator[Tx]:
        if getattr(self._held, "conn", None) is not None:
            raise DatabaseError("a transaction was begun inside another on the same thread; pass the open "
                                "transaction down instead")
        with self._reaching(), self._pooled() as conn:
            # BEGIN and the write lock go out with the transaction's first statement, in one round trip
            tx = PostgresTx(conn, to_postgres, self._pipelines, _BEGIN_SERIALIZED if serialized else ("BEGIN",))
            self._held.conn = tx._conn
            try:
                yield tx
            except BaseException:
                if tx._conn.begun and not (tx._conn.committed or tx._conn.commit_failed):
                    _roll_back(conn)
                raise
            finally:
                self._held.conn = None
            if tx._conn.commit_failed is not None:  # raised even where the caller caught it: nothing was kept
                raise DatabaseError(f"the commit failed and nothing of this transaction was stored "
                                    f"({type(tx._conn.commit_failed).__name__}: {tx._conn.commit_failed})") \
                    from tx._conn.commit_failed
            if not tx._conn.begun or tx._conn.committed:
                return
            if conn.info.transaction_status == self._psycopg.pq.TransactionStatus.INERROR:
                # a statement failed and its error was caught without undoing it: COMMIT would roll back in
                # silence, and a caller would take writes for stored that are not
                _roll_back(conn)
                raise DatabaseError("a statement of this transaction failed and nothing of it was stored; "
                                    "the error was caught without its savepoint being undone")
            conn.execute("COMMIT")

    def query(self, sql: str, params: tuple = ()) -> list[dict]:
        held = getattr(self._held, "conn", None)
        if held is not None:  # inside this thread's transaction: on its connection (see above)
            return list(held.execute(to_postgres(sql), params))
        with self._reaching(), self._pooled() as conn:
            return list(conn.execute(to_postgres(sql), params))

    def _pooled(self):
        """A connection of the pool, waited for as long as the pool's timeout while the database answers and
        AWAY_WAIT_SECONDS while it is known to be out of reach (the wait itself starts a new connection)."""
        return self._pool.connection(timeout=AWAY_WAIT_SECONDS if self._away is not None else None)

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        """A lost connection or a server out of reach (the pool's wait for a connection ran out) becomes one
        DatabaseUnreachable naming the server and the fix; an error of the statement itself passes unchanged.
        A lost connection marks the database out of reach (see ``_pooled``) until a use of it succeeds."""
        from psycopg_pool import PoolTimeout

        try:
            yield
        except self._psycopg.OperationalError as exc:
            if not _connection_lost(exc):
                raise
            # A wait that ran out names the outage's first cause; on its own (the database answers, the pool
            # was busy) it marks nothing.
            reason = self._away if isinstance(exc, PoolTimeout) and self._away else _reason(exc, self.url)
            if not isinstance(exc, PoolTimeout):
                self._went_away(reason)
            raise DatabaseUnreachable(f"the database at {self.where} cannot be reached ({reason}); "
                                      "the controller keeps trying and goes on when it is back: check that the "
                                      "database server is up and that this host reaches it") from exc
        if self._away is not None:
            self._away = None
            log.info("the database answers again", database=self.where)

    def _went_away(self, reason: str) -> None:
        if self._away is None:
            self._away = reason
            log.warning("the database cannot be reached; requests are answered at once until it is back",
                        database=self.where, error=reason)

    def _reconnecting_failed(self, pool) -> None:
        """The pool's retries of a lost connection all failed (``RECONNECT_SECONDS``): the database is away."""
        self._went_away("no connection could be made")

    def close(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()


_BEGIN_SERIALIZED = ("BEGIN", f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")


def _connection_lost(exc: Exception) -> bool:
    """Whether a psycopg OperationalError is about the connection, not the statement: no SQLSTATE (the socket
    closed, the pool found no connection in time), class 08 (connection exception) or 57P0x (the server shut down)."""
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith(("08", "57P0"))


def _roll_back(conn) -> None:
    """End the connection's failed transaction; where even that fails (the connection is gone), the pool discards
    the connection, and the error the caller sees is the first one."""
    try:
        conn.execute("ROLLBACK")
    except Exception:  # noqa: BLE001 - the original error is the one raised
        pass


# The server drops a dead client's session (and so its locks) within ~10 s; the client notices a dead server too.
KEEPALIVES = dict(keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3)


def _configure(conn) -> None:
    """NUMERIC results (SUM of integers) as SQLite gives them: an int when whole, else a float."""
    from psycopg.types.numeric import NumericLoader

    class WholeOrFloat(NumericLoader):
        def load(self, data):
            value = super().load(data)
            return int(value) if value == value.to_integral_value() else float(value)

    conn.adapters.register_loader("numeric", WholeOrFloat)


def postgres_location(url: str) -> str:
    """``host:port/database`` of a Postgres URL, for messages (no user, no password)."""
    parts = urlsplit(url)
    try:
        port = parts.port or 5432
    except ValueError:
        port = "?"
    return f"{parts.hostname or 'localhost'}:{port}/{unquote(parts.path.lstrip('/')) or '(default database)'}"


def _reason(exc: Exception, url: str) -> str:
    """The driver's first line about a failed connection, with the password taken out should it appear."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    return hide_secrets(text, url).removeprefix("connection failed: ")
