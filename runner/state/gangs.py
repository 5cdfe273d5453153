"""Reads and writes of a gang's nodes per attempt (``attempt_nodes``): who holds which rank, where, at what
price, whether it has registered (with its address) for the attempt, how its job ended on it, and the
node's end in the restart log (``kept``, ``preempted``, ...).

A single-node attempt has no rows here; its node is the attempt's ``node_id`` as before.
"""

from __future__ import annotations

import json

from .db import Tx
from .rows import AttemptNode
from .values import Offer
from .store import LIVE_NODE_STATES, Store


class GangStore:
    def __init__(self, store: Store):
        self.store = store
        self.db = store.db

    # --- planning -----------------------------------------------------------------------------
    def add(self, tx: Tx, job_id: str, attempt: int, rank: int, node_id: str, offer: Offer, spot: bool) -> None:
        """Give ``rank`` of an attempt to a node (a new one, or one kept from the previous attempt)."""
        price = offer.price(spot)
        tx.execute(
            """INSERT INTO attempt_nodes (job_id, attempt, rank, node_id, zone, instance_type, spot, price_per_hour)
               VALUES (?,?,?,?,?,?,?,?)""",
            (job_id, attempt, rank, node_id, offer.zone, offer.instance_type, int(spot), price or 0.0),
        )

    def forget_attempt(self, tx: Tx, job_id: str, attempt: int) -> None:
        """An attempt whose gang could not be launched is taken back, with its rank assignments."""
        tx.execute("DELETE FROM attempt_nodes WHERE job_id = ? AND attempt = ?", (job_id, attempt))

    def set_master_port(self, tx: Tx, job_id: str, attempt: int, port: int) -> None:
        tx.execute("UPDATE attempts SET master_port = COALESCE(master_port, ?) WHERE job_id = ? AND attempt = ?",
                   (port, job_id, attempt))

    # --- reads --------------------------------------------------------------------------------
    def nodes_of(self, job_id: str, attempt: int, tx: Tx | None = None) -> list[AttemptNode]:
        """The attempt's rank assignments, in rank order."""
        sql = "SELECT * FROM attempt_nodes WHERE job_id = ? AND attempt = ? ORDER BY rank"
        rows = tx.all(sql, (job_id, attempt)) if tx else self.db.query(sql, (job_id, attempt))
        return [AttemptNode.from_row(r) for r in rows]

    def latest_for_node(self, node_id: str, tx: Tx | None = None) -> AttemptNode | None:
        """The newest attempt a node was given a rank in."""
        sql = "SELECT * FROM attempt_nodes WHERE node_id = ? ORDER BY attempt DESC LIMIT 1"
        row = tx.one(sql, (node_id,)) if tx else next(iter(self.db.query(sql, (node_id,))), None)
        return AttemptNode.from_row(row) if row else None

    def live_nodes_per_zone(self, tx: Tx | None = None) -> dict[tuple[str, str], int]:
        """How many live nodes (of every job) each (cloud, zone) holds now."""
        marks = ",".join("?" * len(LIVE_NODE_STATES))
        sql = f"SELECT provider, offer FROM nodes WHERE state IN ({marks})"
        rows = tx.all(sql, LIVE_NODE_STATES) if tx else self.db.query(sql, LIVE_NODE_STATES)
        counts: dict[tuple[str, str], int] = {}
        for row in rows:
            key = (row["provider"], json.loads(row["offer"])["zone"])
            counts[key] = counts.get(key, 0) + 1
        return counts

    # --- a node's part in an attempt ---------------------------------------------------------------
    def register(self, tx: Tx, job_id: str, attempt: int, rank: int, address: str, now: float) -> None:
        tx.execute("""UPDATE attempt_nodes SET registered_at = COALESCE(registered_at, ?), address = ?
                      WHERE job_id = ? AND attempt = ? AND rank = ?""", (now, address, job_id, attempt, rank))

    def record_exit(self, tx: Tx, job_id: str, attempt: int, rank: int, reason: str, code: int | None) -> None:
        tx.execute("""UPDATE attempt_nodes SET exit_reason = COALESCE(exit_reason, ?), exit_code = COALESCE(exit_code, ?)
                      WHERE job_id = ? AND attempt = ? AND rank = ?""", (reason, code, job_id, attempt, rank))

    def record_ranks_finished(self, tx: Tx, job_id: str, attempt: int, rank: int, now: float) -> bool:
        """The node's training processes have all finished and exited, its launcher still running: its part of the
        attempt is done. False when its exit was reported first (that report stands)."""
        return tx.execute("""UPDATE attempt_nodes SET ranks_finished_at = COALESCE(ranks_finished_at, ?)
                             WHERE job_id = ? AND attempt = ? AND rank = ? AND exit_reason IS NULL""",
                          (now, job_id, attempt, rank)) > 0

    def set_end_reasons(self, tx: Tx, job_id: str, attempt: int, reasons: dict[int, str]) -> None:
        for rank, reason in reasons.items():
            tx.execute("UPDATE attempt_nodes SET end_reason = ? WHERE job_id = ? AND attempt = ? AND rank = ?",
                       (reason, job_id, attempt, rank))

    def set_drill(self, tx: Tx, job_id: str, attempt: int, drill: dict, message: str | None) -> None:
        self.store.set_attempt_drill(tx, job_id, attempt, drill, message)

    def mark_released(self, tx: Tx, node_id: str, reason: str) -> None:
        """A node kept at the end of its last attempt is given up after all (the gang moved, or it died)."""
        tx.execute("""UPDATE attempt_nodes SET end_reason = ? WHERE node_id = ? AND end_reason = 'kept'
                      AND attempt = (SELECT MAX(attempt) FROM attempt_nodes WHERE node_id = ? AND end_reason != 'running')""",
                   (reason, node_id, node_id))
