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

from typing import Callable

import structlog

from .batching import Batcher, hand_back

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


class BatchedReads(Batcher):
    """Reads gathered while one is out and made together on a thread of their own."""

    def __init__(self, read_many: ReadMany, max_batch: int = MAX_BATCH):
        super().__init__("heartbeat-reads", max_batch, join_seconds=10)
        self._read_many = read_many

    async def get(self, key: str) -> dict | None:
        return await self._submit(key)

    def _serve_batch(self, batch) -> None:
        try:
            views = self._read_many(list({key for key, _, _ in batch}))
        except Exception as exc:  # the database is unreachable for a moment: these beats get a 500, the next retry
            log.warning("heartbeat read failed", error=str(exc), beats=len(batch))
            for _, answer, loop in batch:
                hand_back(loop, answer, exc, failed=True)
            return
        for key, answer, loop in batch:
            hand_back(loop, answer, views.get(key))


def heartbeat_reads(store) -> DirectReads | BatchedReads:
    """Batched on a shared database, direct on a local one."""
    return (BatchedReads if store.db.shared else DirectReads)(lambda keys: store.heartbeat_views(keys))
