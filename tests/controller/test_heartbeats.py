"""Heartbeats are kept in memory and written together once a second: a short transaction per FLUSH_BATCH beats."""

from __future__ import annotations

import time

import pytest

from runner.controller.heartbeats import HeartbeatBook
from runner.state import Store, open_database
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


class CountingTransactions:
    """The store's database, counting the write transactions opened through it."""

    def __init__(self, db):
        self.db, self.count = db, 0

    def transaction(self):
        self.count += 1
        return self.db.transaction()

    def __getattr__(self, name):
        return getattr(self.db, name)


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
        def transaction(self):
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
        def transaction(self):
            opened.append(1)
            if len(opened) == 2:
                raise OSError("disk I/O error")
            return real.transaction()

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
