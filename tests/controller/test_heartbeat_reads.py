"""Heartbeat reads batched on a shared database (runner/controller/heartbeat_reads.py): beats that arrive while
a read is out are answered by the next read, together; a failed read fails only the beats it was for."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runner.controller.heartbeat_reads import BatchedReads, DirectReads


class SlowDatabase:
    """``read_many`` that holds its first call until told to go on, recording every batch it was asked."""

    def __init__(self):
        self.batches: list[list[str]] = []
        self.first_call = threading.Event()
        self.go_on = threading.Event()
        self.fail_next = False

    def read_many(self, keys: list[str]) -> dict[str, dict]:
        self.batches.append(sorted(keys))
        self.first_call.set()
        self.go_on.wait(60)
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("server closed the connection")
        return {key: {"id": key} for key in keys if key != "unknown"}


def run(coroutine):
    return asyncio.run(coroutine)


def test_beats_arriving_while_a_read_is_out_share_the_next_read():
    db = SlowDatabase()
    reads = BatchedReads(db.read_many)
    reads.start()

    async def scenario():
        first = asyncio.ensure_future(reads.get("n-0"))
        await asyncio.get_running_loop().run_in_executor(None, db.first_call.wait, 60)
        rest = [asyncio.ensure_future(reads.get(f"n-{i}")) for i in range(1, 50)]
        rest.append(asyncio.ensure_future(reads.get("unknown")))
        await asyncio.sleep(0)  # every request is queued behind the read that is out
        db.go_on.set()
        return await first, await asyncio.gather(*rest)

    try:
        first, rest = run(scenario())
    finally:
        reads.stop()
    assert first == {"id": "n-0"}
    assert rest[:-1] == [{"id": f"n-{i}"} for i in range(1, 50)] and rest[-1] is None
    assert db.batches == [["n-0"], sorted([f"n-{i}" for i in range(1, 50)] + ["unknown"])]


def test_a_failed_read_fails_its_beats_and_the_next_beat_is_read_again():
    db = SlowDatabase()
    db.go_on.set()
    db.fail_next = True
    reads = BatchedReads(db.read_many)
    reads.start()
    try:
        with pytest.raises(ConnectionError):
            run(reads.get("n-1"))
        assert run(reads.get("n-1")) == {"id": "n-1"}
    finally:
        reads.stop()


def test_a_stopped_reader_refuses_new_beats():
    reads = BatchedReads(SlowDatabase().read_many)
    reads.start()
    reads.stop()
    with pytest.raises(RuntimeError, match="stopping"):
        run(reads.get("n-1"))


def test_a_local_database_is_read_at_once():
    db = SlowDatabase()
    db.go_on.set()
    assert run(DirectReads(db.read_many).get("n-7")) == {"id": "n-7"}
    assert db.batches == [["n-7"]]
