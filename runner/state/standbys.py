"""Replacements prepared while a job still trains: the SQL of runner/scheduler/standby.py.

A prepared replacement is a node row of its job with attempt 0 (no attempt yet: the job's next attempt is
created on it only when the running one ends) and ``prepared_for`` naming the attempt it may replace. Its
agent registers, fetches the workdir, runs setup and reports ready (``ready_at``); it then waits. The attempt
it stood by for keeps the story in ``attempts.standby`` (JSON): why it was launched, when, when it was ready,
and what became of it (``took over``, ``released``...), shown in the restart log.
"""

from __future__ import annotations

import json

from . import ledger
from .db import Tx
from .rows import Node
from .values import Offer
from .store import NODE_LAUNCHING, NODE_RUNNING, NODE_TERMINATING, Store

PREPARED = 0  # a prepared node's attempt number until it takes over
PREPARED_LIVE = (NODE_LAUNCHING, NODE_RUNNING)


class StandbyStore:
    def __init__(self, store: Store):
        self.store = store
        self.db = store.db

    def insert(self, tx: Tx, node_id: str, job_id: str, for_attempt: int, provider: str, token_hash: str,
               offer: Offer, spot: bool, now: float, record: dict, rank: int = 0) -> None:
        """A prepared node row (launched by the reconciler like any ``launching`` node) and its record; ``rank``:
        of a gang, the rank it replaces."""
        self.store.insert_node(tx, node_id, job_id, PREPARED, provider, token_hash, offer, spot, now, rank=rank)
        tx.execute("UPDATE nodes SET prepared_for = ? WHERE id = ?", (for_attempt, node_id))
        self.set_record(tx, job_id, for_attempt, record)

    def live(self, job_id: str, tx: Tx | None = None) -> Node | None:
        """The job's prepared node still launching or running (at most one), or None."""
        sql = (f"SELECT * FROM nodes WHERE job_id = ? AND attempt = {PREPARED} AND prepared_for IS NOT NULL "
               "AND state IN (?, ?) ORDER BY created_at DESC")
        params = (job_id, *PREPARED_LIVE)
        rows = tx.all(sql, params) if tx else self.db.query(sql, params)
        return Node.from_row(rows[0]) if rows else None

    def every_live(self) -> list[Node]:
        rows = self.db.query(f"SELECT * FROM nodes WHERE attempt = {PREPARED} AND prepared_for IS NOT NULL "
                             "AND state IN (?, ?) ORDER BY created_at", PREPARED_LIVE)
        return [Node.from_row(r) for r in rows]

    def mark_ready(self, tx: Tx, node_id: str, now: float) -> Node | None:
        """The prepared node's agent has run setup; the node (None if it is not a live prepared node)."""
        node = self.store.node(node_id, tx)
        if node is None or node.attempt != PREPARED or node.prepared_for is None or node.state not in PREPARED_LIVE:
            return None
        tx.execute("UPDATE nodes SET ready_at = COALESCE(ready_at, ?) WHERE id = ?", (now, node_id))
        self.update_record(tx, node.job_id, node.prepared_for, ready_at=now)
        return node

    def take_over(self, tx: Tx, node: Node, attempt: int) -> None:
        """The job's next attempt runs on the prepared node."""
        tx.execute("UPDATE nodes SET attempt = ? WHERE id = ?", (attempt, node.id))

    def record_take_over(self, tx: Tx, node: Node, attempt: int, now: float) -> str:
        """The prepared node is the new attempt's, at its rank: the attempt's ledger starts with the node's boot
        and setup, which ran before the attempt existed (a node still getting ready reports them to the
        attempt as usual), and the standby's record says it took over. "ready" or "still getting ready"."""
        self.take_over(tx, node, attempt)
        if node.boot_seconds is not None:
            ledger.record_start_phase(tx, node.job_id, attempt, node.rank, "boot_seconds", node.boot_seconds,
                                      keep_first=True)
        if node.setup_seconds is not None:
            ledger.record_start_phase(tx, node.job_id, attempt, node.rank, "setup_seconds", node.setup_seconds)
        self.update_record(tx, node.job_id, node.prepared_for, outcome="took over", took_over_at=now,
                           next_attempt=attempt)
        return "ready" if node.ready_at is not None else "still getting ready"

    def release(self, tx: Tx, node: Node) -> None:
        if self.store.node(node.id, tx).state in PREPARED_LIVE:
            self.store.update_node(tx, node.id, state=NODE_TERMINATING)

    def release_job(self, tx: Tx, job_id: str) -> list[Node]:
        """Release the job's live prepared node(s) (its job has ended); return them."""
        rows = tx.all(f"SELECT * FROM nodes WHERE job_id = ? AND attempt = {PREPARED} AND prepared_for IS NOT NULL "
                      "AND state IN (?, ?)", (job_id, *PREPARED_LIVE))
        nodes = [Node.from_row(r) for r in rows]
        for node in nodes:
            self.store.update_node(tx, node.id, state=NODE_TERMINATING)
        return nodes

    # --- the record on the attempt it stood by for --------------------------------------------------------
    def record(self, tx: Tx | None, job_id: str, attempt: int) -> dict | None:
        sql, params = "SELECT standby FROM attempts WHERE job_id = ? AND attempt = ?", (job_id, attempt)
        row = tx.one(sql, params) if tx else next(iter(self.db.query(sql, params)), None)
        return json.loads(row["standby"]) if row and row["standby"] else None

    def set_record(self, tx: Tx, job_id: str, attempt: int, record: dict) -> None:
        tx.execute("UPDATE attempts SET standby = ? WHERE job_id = ? AND attempt = ?",
                   (json.dumps(record), job_id, attempt))

    def update_record(self, tx: Tx, job_id: str, attempt: int, **fields) -> None:
        record = self.record(tx, job_id, attempt)
        if record is not None:
            self.set_record(tx, job_id, attempt, {**record, **fields})

    def dismiss_notice(self, tx: Tx, job_id: str, attempt: int, message: str) -> None:
        """A notice that turned out false: the attempt is no longer on notice (a later one is heard anew)."""
        tx.execute("UPDATE attempts SET notice = NULL, message = ? WHERE job_id = ? AND attempt = ?",
                   (message, job_id, attempt))
