"""Heartbeats are kept in memory and written together once a second: a short transaction per FLUSH_BATCH beats."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from runner.controller.heartbeats import HeartbeatBook
from runner.state import Store, open_database
from database_probes import CountingTransactions, until, waiting_for_a_lock
from stored import job_spec, offer as make_offer

OFFER = make_offer(cloud="memory", region="mem", zone="mem-a", spot_price=0.01, on_demand_price=0.05)


@pytest.fixture
def book(store):
    """A started book whose flusher waits an hour: each test flushes when it chooses."""
    book = HeartbeatBook(store, interval=3600)
    book.start()
    yield book
    book.stop()


@pytest.fixture
def store(db_url):
    store = Store(open_database(db_url))
    with store.db.transaction() as tx:
        store.insert_job(tx, "j1", "job", job_spec(), "PENDING", time.time())
        for n in range(3):
            store.insert_node(tx, f"n{n}", "j1", 1, "memory", f"hash-{n}", OFFER, True, time.time())
    return store


def test_a_flush_writes_every_nodes_newest_beat_in_one_transaction(store, book):
    """Five beats from three nodes: one transaction, and each node holds its newest time and progress."""
    for n, when in (("n0", 10.0), ("n1", 11.0), ("n0", 12.0), ("n2", 13.0), ("n1", 14.0)):
        book.record(n, when, {"phase": "running", "checkpoint_step": int(when)})
    assert store.node("n0").last_heartbeat is None
    counting = CountingTransactions(store.db)
    store.db = counting
    assert book.flush() == 3 and counting.count == 1
    assert [store.node(n).last_heartbeat for n in ("n0", "n1", "n2")] == [12.0, 14.0, 13.0]
    assert store.node("n1").progress == {"phase": "running", "checkpoint_step": 14}
    assert book.flush() == 0 and counting.count == 1  # nothing new: no transaction at all
    store.db = counting.db


def test_a_controller_flushing_an_older_beat_after_another_wrote_a_newer_one_keeps_the_newer(store):
    """Two controllers on one database (the workers of `runner server --workers N`) each flush the beats that reached
    them; a node whose connection moved from one to the other has its newest beat kept, whichever flushes last."""
    first, second = HeartbeatBook(store, interval=3600), HeartbeatBook(store, interval=3600)
    first.start(), second.start()
    try:
        first.record("n0", 10.0, {"phase": "running", "checkpoint_step": 100})
        second.record("n0", 11.0, {"phase": "running", "checkpoint_step": 110})
        assert second.flush() == 1 and first.flush() == 1
        assert store.node("n0").last_heartbeat == 11.0
        assert store.node("n0").progress == {"phase": "running", "checkpoint_step": 110}
    finally:
        first.stop(), second.stop()


def test_beats_that_could_not_be_written_wait_for_the_next_flush(store, book):
    """A failed write loses nothing; a beat that arrived meanwhile is the one kept."""
    book.record("n0", 10.0, {"phase": "running"})
    real = store.db

    class Down:
        kind = real.kind

        def transaction(self, **kwargs):
            book.record("n0", 11.0, {"phase": "running"})  # arrives while the write fails
            raise OSError("disk I/O error")

    store.db = Down()
    with pytest.raises(OSError):
        book.flush()
    store.db = real
    assert book.flush() == 1 and store.node("n0").last_heartbeat == 11.0


def test_a_large_flush_is_written_in_parts_and_a_failed_part_keeps_only_its_beats(store, book, monkeypatch):
    """Each part holds the write lock briefly; beats of a part already committed are not written twice, and those
    of the part that failed (and after it) wait for the next flush."""
    monkeypatch.setattr("runner.controller.heartbeats.FLUSH_BATCH", 2)
    for n, when in (("n0", 10.0), ("n1", 11.0), ("n2", 12.0)):
        book.record(n, when, {"phase": "running"})
    real, opened = store.db, []

    class SecondFails:
        kind = real.kind

        def transaction(self, **kwargs):
            opened.append(1)
            if len(opened) == 2:
                raise OSError("disk I/O error")
            return real.transaction(**kwargs)

    store.db = SecondFails()
    with pytest.raises(OSError):
        book.flush()
    store.db = real
    assert [store.node(n).last_heartbeat for n in ("n0", "n1", "n2")] == [10.0, 11.0, None]
    counting = CountingTransactions(real)
    store.db = counting
    assert book.flush() == 1 and counting.count == 1  # only n2's beat was still to write
    store.db = real
    assert store.node("n2").last_heartbeat == 12.0


def test_without_a_running_flusher_a_beat_is_written_at_once(store):
    """Before start and after stop, a heartbeat is written as it comes (nothing waits for a flush that never runs)."""
    book = HeartbeatBook(store)
    book.record("n0", 10.0, {"phase": "running"})
    assert store.node("n0").last_heartbeat == 10.0
    book.start()
    book.record("n1", 11.0, {"phase": "running"})
    book.stop()  # writes what was pending
    assert store.node("n1").last_heartbeat == 11.0


# --- Postgres: a flush takes no write lock and never waits for a node's row --------------------------------------
ROW_LOCKS_ONLY_ON_POSTGRES = ("SQLite has one writer at a time: a flush takes the write lock like every write, and "
                              "there are no row locks to skip")


class OpenWriter(threading.Thread):
    """A serialized write transaction, open on a thread of its own: ``step(fn)`` runs ``fn(tx)`` in it and returns
    once done (raising what it raised); ``commit()`` ends it."""

    def __init__(self, store):
        super().__init__(name="open-writer", daemon=True)
        self.store = store
        self.error: Exception | None = None
        self._steps: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()

    def run(self) -> None:
        try:
            with self.store.db.transaction() as tx:
                while (step := self._steps.get()) is not None:
                    step(tx)
                    self._done.put(None)
        except Exception as exc:  # e.g. chosen as a deadlock's victim
            self.error = exc
            self._done.put(exc)

    def step(self, fn) -> None:
        self._steps.put(fn)
        if (error := self._done.get(timeout=60)) is not None:
            raise error

    def commit(self) -> None:
        self._steps.put(None)
        self.join(60)
        assert not self.is_alive(), "the open transaction did not end within 60 s"
        if self.error is not None:
            raise self.error


@contextmanager
def a_serialized_writer(store, first_step):
    """A serialized write transaction that has run ``first_step`` and stays open (holding the write lock and the rows
    it wrote) until the block ends, then commits."""
    writer = OpenWriter(store)
    writer.start()
    try:
        writer.step(first_step)
        yield writer
    finally:
        if writer.is_alive():
            writer.commit()


def test_a_flush_does_not_wait_for_a_serialized_writer_holding_the_write_lock(store, book, backend):
    """2,000 beats a second written under the write lock made every report queue behind them: a flush writes its
    beats while another controller's serialized transaction (one that touches no node) is still open."""
    if backend == "sqlite":
        pytest.skip(ROW_LOCKS_ONLY_ON_POSTGRES)
    book.record("n0", 10.0, {"phase": "running", "checkpoint_step": 100})
    with ThreadPoolExecutor(1) as pool, a_serialized_writer(
            store, lambda tx: store.add_event(tx, "j1", "message", "a serialized write, still open")):
        flushed = pool.submit(book.flush)
        assert flushed.result(timeout=60) == 1  # before: it waited for the writer's commit (here: the timeout)
        assert store.node("n0").last_heartbeat == 10.0  # committed, with the writer still open
    assert store.node("n0").progress == {"phase": "running", "checkpoint_step": 100}


def test_a_node_row_another_transaction_holds_is_skipped_and_its_newest_beat_written_by_a_later_flush(store, book,
                                                                                                      backend):
    """The flush writes the rows it can lock at once and keeps the beat of a row held by an open transaction for the
    next flush, where the newest beat of that node that arrived meanwhile is the one written."""
    if backend == "sqlite":
        pytest.skip(ROW_LOCKS_ONLY_ON_POSTGRES)
    for n in ("n0", "n1", "n2"):
        book.record(n, 10.0, {"phase": "running"})
    with ThreadPoolExecutor(1) as pool, a_serialized_writer(
            store, lambda tx: store.update_node(tx, "n1", provider_ref="held")):
        assert pool.submit(book.flush).result(timeout=60) == 2  # n1 skipped, without waiting for its row
        assert [store.node(n).last_heartbeat for n in ("n0", "n1", "n2")] == [10.0, None, 10.0]
        book.record("n1", 11.0, {"phase": "running", "checkpoint_step": 110})  # a newer beat arrives meanwhile
    assert book.flush() == 1
    assert store.node("n1").last_heartbeat == 11.0 and store.node("n1").progress["checkpoint_step"] == 110
    assert store.node("n1").provider_ref == "held"  # the other transaction's write is kept too
    assert book.flush() == 0  # nothing left over


def test_a_skipped_beat_written_later_never_replaces_a_newer_one_stored_meanwhile(store, book, backend):
    """A node's row is held by its registration, which stores a newer heartbeat time: the flush's older beat, kept
    for the next flush, does not overwrite it."""
    if backend == "sqlite":
        pytest.skip(ROW_LOCKS_ONLY_ON_POSTGRES)
    book.record("n1", 10.0, {"phase": "running", "checkpoint_step": 100})
    with ThreadPoolExecutor(1) as pool, a_serialized_writer(
            store, lambda tx: store.update_node(tx, "n1", registered_at=12.0, last_heartbeat=12.0)):
        assert pool.submit(book.flush).result(timeout=60) == 0
    assert book.flush() == 1  # written, unless older than what is stored: it is
    assert store.node("n1").last_heartbeat == 12.0 and store.node("n1").progress is None


def test_a_flush_and_a_serialized_writer_updating_the_same_nodes_in_reverse_order_do_not_deadlock(store, book,
                                                                                                   backend):
    """The writer holds n2 and then updates n1 and n0; the flush writes n0, n1, n2 in that order. A flush that waited
    for n2 while holding n0 and n1 would deadlock with it (Postgres then aborts one of the two after
    deadlock_timeout): both commit, and n2's beat is written once its row is free."""
    if backend == "sqlite":
        pytest.skip(ROW_LOCKS_ONLY_ON_POSTGRES)
    for n in ("n0", "n1", "n2"):
        book.record(n, 10.0, {"phase": "running"})
    with ThreadPoolExecutor(1) as pool, a_serialized_writer(
            store, lambda tx: store.update_node(tx, "n2", provider_ref="writer")) as writer:
        flushed = pool.submit(book.flush)
        until(lambda: flushed.done() or waiting_for_a_lock(store.db) > 0, "the flush to end or wait for a lock")

        def the_rest_in_reverse(tx):
            for n in ("n1", "n0"):
                store.update_node(tx, n, provider_ref="writer")

        writer.step(the_rest_in_reverse)  # raises if this transaction was the deadlock's victim
        writer.commit()
        flushed.result(timeout=60)  # ... and this, if the flush was
    book.flush()  # n2's beat, skipped while the writer held its row
    assert [store.node(n).last_heartbeat for n in ("n0", "n1", "n2")] == [10.0, 10.0, 10.0]
    assert [store.node(n).provider_ref for n in ("n0", "n1", "n2")] == ["writer"] * 3
