"""The heartbeat's read of its node and job, batched where the database is a network away.

On SQLite the read is local and takes microseconds: it is made at once, on the event loop. On a database
that controllers share (Postgres) each read is a round trip, and 2,000 beats a second made as 2,000 round
trips from a thread pool cost as many thread switches, each of which can wait out the interpreter's switch
interval (5 ms) behind the busy event loop: measured at 1,000 nodes, beats queued for over a second with
the controller's CPU two-thirds used. Here every beat that arrives while a read is out joins the next one,
read by one thread in one query (as a database commits a group of transactions): the round trips fall as
the load rises, and no beat waits longer than one read behind another. Nothing is cached; each beat is
answered from a read made after it arrived.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

import structlog

log = structlog.get_logger(__name__)

MAX_BATCH = 500  # token hashes in one query (well inside every database's limit on parameters)

ReadMany = Callable[[list[str]], dict[str, dict]]


class DirectReads:
    """Each read made at once, in the caller's thread (a local database)."""

    def __init__(self, read_many: ReadMany):
        self._read_many = read_many

    async def get(self, key: str) -> dict | None:
        return self._read_many([key]).get(key)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class BatchedReads:
    """Reads gathered while one is out and made together on a thread of their own."""

    def __init__(self, read_many: ReadMany, max_batch: int = MAX_BATCH):
        self._read_many = read_many
        self._max_batch = max_batch
        self._waiting: list[tuple[str, asyncio.Future, asyncio.AbstractEventLoop]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    async def get(self, key: str) -> dict | None:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        with self._lock:
            if self._stopping:
                raise RuntimeError("the controller is stopping")
            self._waiting.append((key, answer, loop))
        self._wake.set()
        return await answer

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="heartbeat-reads", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while True:
                with self._lock:
                    batch, self._waiting = self._waiting[:self._max_batch], self._waiting[self._max_batch:]
                    stopping = self._stopping
                if not batch:
                    break
                self._answer(batch)
            if stopping:
                return

    def _answer(self, batch) -> None:
        try:
            views = self._read_many(list({key for key, _, _ in batch}))
        except Exception as exc:  # the database is unreachable for a moment: these beats get a 500, the next retry
            log.warning("heartbeat read failed", error=str(exc), beats=len(batch))
            for _, answer, loop in batch:
                _hand_back(loop, _fail, answer, exc)
            return
        for key, answer, loop in batch:
            _hand_back(loop, _settle, answer, views.get(key))


def _hand_back(loop: asyncio.AbstractEventLoop, settle, answer: asyncio.Future, value) -> None:
    try:
        loop.call_soon_threadsafe(settle, answer, value)
    except RuntimeError:  # that loop has closed (the server stopped): nobody waits for this beat any more
        pass


def _settle(answer: asyncio.Future, value) -> None:
    if not answer.done():  # the request may have been abandoned (its client went away)
        answer.set_result(value)


def _fail(answer: asyncio.Future, exc: Exception) -> None:
    if not answer.done():
        answer.set_exception(exc)


def heartbeat_reads(store) -> DirectReads | BatchedReads:
    """Batched on a shared database, direct on a local one."""
    return (BatchedReads if store.db.shared else DirectReads)(lambda keys: store.heartbeat_views(keys))
