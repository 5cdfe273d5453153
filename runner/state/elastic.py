"""Reads and writes of an elastic gang's worlds (``resources.min_nodes`` below ``num_nodes``).

An elastic attempt goes on when a node leaves it: the survivors train in a smaller world, and the node
launched to replace it joins later. Each world is a *generation* of the attempt (``elastic_worlds``): its
members (the attempt's ranks in ``attempt_nodes``, in the order of their new dense node ranks), where its
rendezvous listens, and why it was formed. Generation 0 is the attempt's first world (every rank, as
planned) and has no row. ``attempt_nodes.left_at`` / ``joined_at`` say when a node left or joined the
attempt (its cost runs between them); ``attempts.world_sizes`` is what the training side reported: the
world size in ranks from each change's step on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .db import Tx
from .store import Store


@dataclass(frozen=True)
class World:
    """One generation of an elastic attempt's world."""

    generation: int
    ranks: tuple[int, ...]  # the attempt's ranks (attempt_nodes.rank) that are members, in node-rank order
    master_addr: str | None  # None for generation 0: the attempt's own rendezvous (gang_fields)
    master_port: int | None
    reason: str = "start"


class ElasticStore:
    def __init__(self, store: Store):
        self.store = store
        self.db = store.db

    def _all(self, tx: Tx | None, sql: str, params: tuple) -> list[dict]:
        return tx.all(sql, params) if tx else self.db.query(sql, params)

    # --- worlds -------------------------------------------------------------------------------
    def worlds(self, job_id: str, attempt: int, tx: Tx | None = None) -> list[World]:
        """The generations after the first, oldest first."""
        rows = self._all(tx, "SELECT * FROM elastic_worlds WHERE job_id = ? AND attempt = ? ORDER BY generation",
                         (job_id, attempt))
        return [World(r["generation"], tuple(json.loads(r["ranks"])), r["master_addr"], int(r["master_port"]),
                      r["reason"]) for r in rows]

    def add_world(self, tx: Tx, job_id: str, attempt: int, world: World, now: float) -> None:
        tx.execute("""INSERT INTO elastic_worlds (job_id, attempt, generation, ranks, master_addr, master_port, reason,
                          created_at) VALUES (?,?,?,?,?,?,?,?)""",
                   (job_id, attempt, world.generation, json.dumps(list(world.ranks)), world.master_addr,
                    world.master_port, world.reason, now))

    # --- nodes leaving and joining --------------------------------------------------------------
    def mark_left(self, tx: Tx, job_id: str, attempt: int, rank: int, reason: str, now: float) -> None:
        """A node left the running attempt: its end (``preempted``/``lost``) and when."""
        tx.execute("""UPDATE attempt_nodes SET left_at = COALESCE(left_at, ?), end_reason = ?
                      WHERE job_id = ? AND attempt = ? AND rank = ?""", (now, reason, job_id, attempt, rank))

    def give_up_unregistered(self, tx: Tx, job_id: str, attempt: int, rank: int, now: float) -> bool:
        """A replacement that has not registered in time leaves the attempt as ``lost``. Read inside the write: False
        when its registration (or its leaving) was written first, which then stands."""
        return tx.execute("""UPDATE attempt_nodes SET left_at = ?, end_reason = 'lost'
                             WHERE job_id = ? AND attempt = ? AND rank = ? AND registered_at IS NULL
                             AND left_at IS NULL""", (now, job_id, attempt, rank)) > 0

    def mark_joined(self, tx: Tx, job_id: str, attempt: int, rank: int, now: float) -> None:
        tx.execute("UPDATE attempt_nodes SET joined_at = ? WHERE job_id = ? AND attempt = ? AND rank = ?",
                   (now, job_id, attempt, rank))

    def count_preemption(self, tx: Tx, job_id: str) -> None:
        """A node lost while the attempt goes on still counts against ``recovery.max_preemptions``."""
        tx.execute("UPDATE jobs SET preemptions = preemptions + 1 WHERE id = ?", (job_id,))

    def count_failure(self, tx: Tx, job_id: str) -> None:
        """A replacement whose job failed while the attempt goes on still counts against ``recovery.max_failures``."""
        tx.execute("UPDATE jobs SET failures = failures + 1 WHERE id = ?", (job_id,))

    # --- what the training side reports ----------------------------------------------------------
    def record_world_size(self, tx: Tx, job_id: str, attempt: int, generation: int, step: int, world_size: int,
                          first: dict | None = None) -> bool:
        """Append a change of world size (once per generation; a late or repeated report is ignored).
        ``first``: the entry before any change, written first when the list is still empty. True if appended."""
        row = tx.one("SELECT world_sizes, world_generation FROM attempts WHERE job_id = ? AND attempt = ?",
                     (job_id, attempt))
        if row is None or generation <= (row["world_generation"] or 0):
            return False
        sizes = json.loads(row["world_sizes"]) if row["world_sizes"] else []
        if not sizes and first is not None:
            sizes.append(first)
        sizes.append({"step": step, "world_size": world_size})
        tx.execute("UPDATE attempts SET world_sizes = ?, world_generation = ? WHERE job_id = ? AND attempt = ?",
                   (json.dumps(sizes), generation, job_id, attempt))
        return True

    def start_world_sizes(self, tx: Tx, job_id: str, attempt: int, step: int, world_size: int) -> None:
        """The attempt's first world size (from its restore), unless a change is recorded already."""
        tx.execute("""UPDATE attempts SET world_sizes = ? WHERE job_id = ? AND attempt = ?
                      AND (world_sizes IS NULL OR world_sizes = '[]')""",
                   (json.dumps([{"step": step, "world_size": world_size}]), job_id, attempt))
