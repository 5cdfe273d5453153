"""Heartbeats kept in memory and written to the database together, once a second.

A heartbeat's time and progress are shown by ``status`` and the web page and decide nothing, so 2,000
nodes beating once a second cost eight short write transactions a second (``FLUSH_BATCH`` beats each, in
node order) instead of 2,000. On SQLite they take the write lock; on Postgres they do not, and skip the
rows another transaction holds, keeping those beats for the next flush (``Store.write_heartbeats``). A
controller that dies loses at most the last second of them; the next beat brings each node's back.
"""

from __future__ import annotations

import json
import threading

import structlog

from ..state import DatabaseUnreachable, Store

log = structlog.get_logger(__name__)

FLUSH_SECONDS = 1.0
# Beats written per transaction: on SQLite each holds the write lock for a few milliseconds, so a report or a
# registration waits behind one part of a flush, not all 2,000 beats of it; on Postgres each holds its rows as briefly.
FLUSH_BATCH = 250


class HeartbeatBook:
    """The newest heartbeat of each node since the last flush; ``flush`` writes them in one transaction."""

    def __init__(self, store: Store, interval: float = FLUSH_SECONDS):
        self.store = store
        self.interval = interval
        self._pending: dict[str, tuple[float, dict]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, node_id: str, when: float, progress: dict) -> None:
        """Keep the node's newest heartbeat for the next flush (written at once while no flusher runs)."""
        with self._lock:
            self._pending[node_id] = (when, progress)
        if self._thread is None:
            self.flush()

    def flush(self) -> int:
        """Write every pending heartbeat; return how many were written. A failed write keeps its beats for the next
        flush, and so does a node whose row another transaction held (Postgres: the flush never waits for a row)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return 0
        # Encoded before the transaction: under load this thread shares the interpreter with the event loop, and
        # Python work inside the transaction would hold the rows (on SQLite the write lock) for as long.
        beats = sorted((node_id, when, json.dumps(progress)) for node_id, (when, progress) in pending.items())
        done, skipped = 0, set()
        try:
            for start in range(0, len(beats), FLUSH_BATCH):
                skipped |= self.store.write_heartbeats(beats[start:start + FLUSH_BATCH])
                done = start + FLUSH_BATCH
        finally:
            self._keep({node_id for node_id, _, _ in beats[done:]} | skipped, pending)
        return len(pending) - len(skipped)

    def _keep(self, node_ids: set[str], pending: dict[str, tuple[float, dict]]) -> None:
        """Put these nodes' beats back for the next flush, unless a newer one arrived meanwhile (that one wins)."""
        if node_ids:
            with self._lock:
                self._pending = {**{node_id: pending[node_id] for node_id in node_ids}, **self._pending}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
        self._thread.start()

    def stop(self) -> int:
        """Stop the flusher and write what it had not yet; later heartbeats are written as they come. Returns how
        many nodes' beats are left unwritten (the database is out of reach: their nodes beat again)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        try:
            self.flush()
        except DatabaseUnreachable:  # said once by the caller, with the rest that could not be written
            pass
        with self._lock:
            return len(self._pending)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.flush()
            except Exception:  # the database is busy or gone for a moment: the beats wait for the next flush
                log.exception("writing heartbeats failed; keeping them for the next flush")
