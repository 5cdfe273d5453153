"""Reads and writes of jobs, attempts, nodes and events: the SQL lives here and nowhere else.

Rows come back as the frozen dataclasses of runner/state/rows.py (:class:`Job`, :class:`Attempt`,
:class:`Node`, :class:`Event`), typed whichever database returned them. The heartbeat's two lean reads
(:meth:`Store.heartbeat_views`, :meth:`Store.watched_nodes`) return dicts of only the columns they need.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from ..protocol.events import EndReason
from ..protocol.states import NodeState
from .checkpoints import CheckpointReport, Recorded, record_checkpoints
from .db import Database, Tx, padded
from .job_changes import add_event
from ..spec.stored import StoredJob, load_stored_job
from .rows import Attempt, AttemptNode, Event, Job, Node
from .values import Notice, Offer

NODE_LAUNCHING = NodeState.LAUNCHING  # the states of a node (runner/protocol/states.py)
NODE_RUNNING = NodeState.RUNNING
NODE_DRAINING = NodeState.DRAINING
NODE_TERMINATING = NodeState.TERMINATING
NODE_TERMINATED = NodeState.TERMINATED
LIVE_NODE_STATES = (NODE_LAUNCHING, NODE_RUNNING, NODE_DRAINING, NODE_TERMINATING)
# A job gets its next node only when none of its nodes is in one of these: a draining node does not hold it back.
NODES_HOLDING_A_JOB = (NODE_LAUNCHING, NODE_RUNNING, NODE_TERMINATING)


class Store:
    """Typed access to the controller's tables."""

    def __init__(self, db: Database):
        self.db = db

    # --- jobs -------------------------------------------------------------
    def insert_job(self, tx: Tx, job_id: str, name: str, spec: StoredJob, state: str, now: float) -> None:
        tx.execute(
            "INSERT INTO jobs (id, name, spec, state, created_at, updated_at) VALUES (?,?,?,?,?,?)",
            (job_id, name, json.dumps(spec.to_json()), state, now, now),
        )
        tx.execute(
            "INSERT INTO events (job_id, time, kind, to_state, message) VALUES (?,?,?,?,?)",
            (job_id, now, "state", state, "submitted"),
        )

    def job(self, job_id: str, tx: Tx | None = None) -> Job | None:
        sql, params = "SELECT * FROM jobs WHERE id = ?", (job_id,)
        row = tx.one(sql, params) if tx else next(iter(self.db.query(sql, params)), None)
        return Job.from_row(row) if row else None

    def jobs(self, states: tuple[str, ...] | None = None) -> list[Job]:
        if states:
            marks = ",".join("?" * len(states))
            rows = self.db.query(f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY created_at", states)
        else:
            rows = self.db.query("SELECT * FROM jobs ORDER BY created_at")
        return [Job.from_row(r) for r in rows]

    def jobs_running_a_gang(self) -> list[Job]:
        """RUNNING jobs whose running attempt is a gang's (more than one node): the only ones that can be elastic.
        The reconciler asks at every tick, so the other running jobs are not read (nor their specs decoded)."""
        rows = self.db.query(
            "SELECT j.* FROM jobs j WHERE j.state = 'RUNNING' AND EXISTS (SELECT 1 FROM attempts a WHERE "
            "a.job_id = j.id AND a.num_nodes > 1 AND a.end_reason = 'running') ORDER BY j.created_at")
        return [Job.from_row(r) for r in rows]

    def job_listing(self, *, states: tuple[str, ...] | None = None, active: tuple[str, ...] = (),
                    ended_since: float | None = None, limit: int | None = None) -> tuple[list[Job], int]:
        """The newest jobs that match (at most ``limit``), oldest first, and how many jobs there are in all.

        ``states``: only jobs in these; else, with ``ended_since``, the jobs in ``active`` and those that ended
        since then; else every job. Indexed (jobs_state, jobs_ended_at, jobs_created_at): at 10,000 jobs the
        default listing reads only the rows it returns."""
        where, params = "", []
        if states:
            where = f"WHERE state IN ({','.join('?' * len(states))})"
            params = list(states)
        elif ended_since is not None:
            where = f"WHERE state IN ({','.join('?' * len(active))}) OR ended_at >= ?" if active else \
                "WHERE ended_at >= ?"
            params = [*active, ended_since]
        sql = f"SELECT * FROM jobs {where} ORDER BY created_at DESC, id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        rows = self.db.query(sql, tuple(params))
        total = self.db.query("SELECT COUNT(*) AS n FROM jobs")[0]["n"]
        return [Job.from_row(r) for r in reversed(rows)], int(total)

    def attempts_of(self, job_ids: list[str]) -> dict[str, list[Attempt]]:
        """The attempts of many jobs at once (a few queries, not one per job), each job's in order."""
        found: dict[str, list[Attempt]] = {job_id: [] for job_id in job_ids}
        for start in range(0, len(job_ids), 500):
            chunk = tuple(job_ids[start:start + 500])
            marks = ",".join("?" * len(chunk))
            rows = self.db.query(f"SELECT * FROM attempts WHERE job_id IN ({marks}) ORDER BY job_id, attempt", chunk)
            gangs = tuple({row["job_id"] for row in rows if row["num_nodes"] > 1})
            ranks: dict[tuple[str, int], list[AttemptNode]] = {}
            if gangs:
                gang_marks = ",".join("?" * len(gangs))
                for node in self.db.query(f"SELECT * FROM attempt_nodes WHERE job_id IN ({gang_marks}) "
                                          "ORDER BY job_id, attempt, rank", gangs):
                    ranks.setdefault((node["job_id"], node["attempt"]), []).append(AttemptNode.from_row(node))
            for row in rows:
                found[row["job_id"]].append(Attempt.from_row(row, tuple(ranks.get((row["job_id"], row["attempt"]), ()))))
        return found

    def cancelled_jobs(self, states: tuple[str, ...]) -> list[Job]:
        """Jobs in ``states`` whose cancel the user has asked for (the others are not read at all)."""
        marks = ",".join("?" * len(states))
        rows = self.db.query(f"SELECT * FROM jobs WHERE cancel_requested > 0 AND state IN ({marks}) "
                             "ORDER BY created_at", states)
        return [Job.from_row(r) for r in rows]

    def set_job_message(self, tx: Tx, job_id: str, message: str) -> None:
        """Say why a job waits, without a state change (``updated_at`` stays: it is when the wait began)."""
        tx.execute("UPDATE jobs SET message = ? WHERE id = ?", (message, job_id))

    def request_cancel(self, tx: Tx, job_id: str, now: float) -> None:
        """Record when the user asked to cancel (the agent's grace runs from then); a second request keeps the first."""
        tx.execute("UPDATE jobs SET cancel_requested = ? WHERE id = ? AND cancel_requested = 0", (now, job_id))

    def record_checkpoint(self, tx: Tx, job_id: str, attempt: int, checkpoint: dict) -> bool:
        """Remember a committed checkpoint unless a newer attempt has started (fencing)."""
        return self.record_checkpoints(tx, [CheckpointReport(job_id, attempt, checkpoint)]).accepted[0]

    def record_checkpoints(self, tx: Tx, reports: list[CheckpointReport], then_commit: bool = False) -> Recorded:
        """Many reported checkpoints at once, each as ``record_checkpoint`` would (runner/state/checkpoints.py);
        ``then_commit``: nothing follows in ``tx`` (its COMMIT may go out with them)."""
        return record_checkpoints(tx, reports, postgres=self.db.kind == "postgres", then_commit=then_commit)

    # --- attempts ---------------------------------------------------------
    def insert_attempt(self, tx: Tx, job_id: str, node_id: str, offer: Offer, spot: bool,
                       resumed_from_step: int, now: float, num_nodes: int = 1, master_port: int | None = None) -> int:
        """A new attempt; a gang's (``num_nodes`` > 1) names its rank-0 node and per-node price here, and its
        ranks in ``attempt_nodes`` (runner/state/gangs.py)."""
        row = tx.one("SELECT COALESCE(MAX(attempt), 0) + 1 AS n FROM attempts WHERE job_id = ?", (job_id,))
        attempt = row["n"]
        price = offer.price(spot)
        tx.execute(
            """INSERT INTO attempts (job_id, attempt, node_id, cloud, region, zone, instance_type, spot,
                   price_per_hour, started_at, resumed_from_step, num_nodes, master_port)
               VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)""",
            (job_id, attempt, node_id, offer.cloud, offer.region, offer.zone,
             offer.instance_type, int(spot), price or 0.0, now, resumed_from_step, num_nodes, master_port),
        )
        return attempt

    def attempts_of_jobs_in(self, job_states: tuple[str, ...]) -> dict[str, list[Attempt]]:
        """Every attempt of the jobs in ``job_states``, per job in order (as :meth:`attempts` gives one job's), in
        two reads whatever the number of jobs: the reconciler's view of its queue at a tick."""
        marks = ",".join("?" * len(job_states))
        rows = self.db.query(f"SELECT a.* FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.state IN ({marks}) "
                             "ORDER BY a.job_id, a.attempt", job_states)
        ranks: dict[tuple[str, int], list[AttemptNode]] = {}
        if any(row["num_nodes"] > 1 for row in rows):
            for node in self.db.query(
                    f"SELECT n.* FROM attempt_nodes n JOIN jobs j ON j.id = n.job_id WHERE j.state IN ({marks}) "
                    "ORDER BY n.job_id, n.attempt, n.rank", job_states):
                ranks.setdefault((node["job_id"], node["attempt"]), []).append(AttemptNode.from_row(node))
        found: dict[str, list[Attempt]] = {}
        for row in rows:
            nodes = tuple(ranks.get((row["job_id"], row["attempt"]), ()))
            found.setdefault(row["job_id"], []).append(Attempt.from_row(row, nodes))
        return found

    def jobs_with_nodes_in(self, node_states: tuple[str, ...], job_states: tuple[str, ...]) -> set[str]:
        """Ids of the jobs in ``job_states`` that have a node in ``node_states``, in one read."""
        node_marks, job_marks = ",".join("?" * len(node_states)), ",".join("?" * len(job_states))
        rows = self.db.query(f"SELECT DISTINCT n.job_id FROM nodes n JOIN jobs j ON j.id = n.job_id WHERE n.state IN "
                             f"({node_marks}) AND j.state IN ({job_marks})", (*node_states, *job_states))
        return {row["job_id"] for row in rows}

    def attempts(self, job_id: str, tx: Tx | None = None) -> list[Attempt]:
        """The job's attempts in order; a gang's carry ``nodes``, its rank assignments in rank order."""
        sql, params = "SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt", (job_id,)
        rows = tx.all(sql, params) if tx else self.db.query(sql, params)
        ranks: dict[int, list[AttemptNode]] = {}
        if any(row["num_nodes"] > 1 for row in rows):
            sql = "SELECT * FROM attempt_nodes WHERE job_id = ? ORDER BY attempt, rank"
            for node in (tx.all(sql, params) if tx else self.db.query(sql, params)):
                ranks.setdefault(node["attempt"], []).append(AttemptNode.from_row(node))
        return [Attempt.from_row(row, tuple(ranks.get(row["attempt"], ()))) for row in rows]

    def current_attempt(self, job_id: str, tx: Tx | None = None) -> Attempt | None:
        rows = self.attempts(job_id, tx)
        return rows[-1] if rows and rows[-1].end_reason == EndReason.RUNNING else None

    def unformed_attempts(self, job_states: tuple[str, ...]) -> list[Attempt]:
        """The running attempts of jobs in ``job_states`` whose nodes have not all registered yet: a multi-node
        job's, and a one-node job's whose launched node has never registered."""
        marks = ",".join("?" * len(job_states))
        rows = self.db.query(
            "SELECT a.* FROM attempts a JOIN jobs j ON j.id = a.job_id LEFT JOIN nodes n ON n.id = a.node_id "
            "WHERE a.running_at IS NULL AND a.end_reason = 'running' "
            "AND (a.num_nodes > 1 OR (n.id IS NOT NULL AND n.registered_at IS NULL)) "
            f"AND j.state IN ({marks}) ORDER BY a.started_at", job_states)
        return [Attempt.from_row(r) for r in rows]

    def mark_attempt_running(self, tx: Tx, job_id: str, attempt: int, now: float) -> None:
        tx.execute("UPDATE attempts SET running_at = COALESCE(running_at, ?) WHERE job_id = ? AND attempt = ?",
                   (now, job_id, attempt))

    def set_resumed_from(self, tx: Tx, job_id: str, attempt: int, step: int) -> None:
        """Record the step the training really restored (less than handed over when that one failed)."""
        tx.execute("UPDATE attempts SET resumed_from_step = ? WHERE job_id = ? AND attempt = ?",
                   (step, job_id, attempt))

    def set_attempt_message(self, tx: Tx, job_id: str, attempt: int, message: str) -> None:
        tx.execute("UPDATE attempts SET message = ? WHERE job_id = ? AND attempt = ?", (message, job_id, attempt))

    def set_attempt_notice(self, tx: Tx, job_id: str, attempt: int, notice: Notice) -> None:
        tx.execute("UPDATE attempts SET notice = COALESCE(notice, ?) WHERE job_id = ? AND attempt = ?",
                   (json.dumps(notice.to_json()), job_id, attempt))

    def delete_running_attempt(self, tx: Tx, job_id: str, attempt: int) -> None:
        """An attempt whose launch failed is taken back (it never ran; the restart log does not show it)."""
        tx.execute("DELETE FROM attempts WHERE job_id = ? AND attempt = ? AND end_reason = 'running'",
                   (job_id, attempt))

    def restored_at(self, tx: Tx, job_id: str, attempt: int) -> float | None:
        """When the attempt's training first reported its restore (None if it has not)."""
        row = tx.one("SELECT MIN(time) AS t FROM events WHERE job_id = ? AND attempt = ? AND kind = 'restored'",
                     (job_id, attempt))
        return None if row is None or row["t"] is None else float(row["t"])

    def last_drill_attempt(self, tx: Tx, job_id: str) -> int | None:
        """The newest attempt that ended as a resume drill."""
        row = tx.one("SELECT MAX(attempt) AS a FROM attempts WHERE job_id = ? AND end_reason = 'drill'", (job_id,))
        return None if row is None or row["a"] is None else int(row["a"])

    def set_attempt_drill(self, tx: Tx, job_id: str, attempt: int, drill: dict, message: str | None) -> None:
        tx.execute("UPDATE attempts SET drill = ?, message = COALESCE(?, message) WHERE job_id = ? AND attempt = ?",
                   (json.dumps(drill), message, job_id, attempt))

    # --- nodes ------------------------------------------------------------
    def insert_node(self, tx: Tx, node_id: str, job_id: str, attempt: int, provider: str,
                    token_hash: str, offer: Offer, spot: bool, now: float, rank: int = 0) -> None:
        tx.execute(
            """INSERT INTO nodes (id, job_id, attempt, provider, state, token_hash, offer, spot, created_at, rank)
               VALUES (?,?,?,?,?,?,?,?,?,?)""",
            (node_id, job_id, attempt, provider, NODE_LAUNCHING, token_hash, json.dumps(offer.to_json()), int(spot), now, rank),
        )

    def node(self, node_id: str, tx: Tx | None = None) -> Node | None:
        sql, params = "SELECT * FROM nodes WHERE id = ?", (node_id,)
        row = tx.one(sql, params) if tx else next(iter(self.db.query(sql, params)), None)
        return Node.from_row(row) if row else None

    def node_by_token_hash(self, token_hash: str, tx: Tx | None = None) -> Node | None:
        """The node a token belongs to, read fresh each time (by the index of migration 9); inside ``tx`` where
        given (a write transaction must not wait for a second connection while it holds the write lock)."""
        sql, params = "SELECT * FROM nodes WHERE token_hash = ?", (token_hash,)
        rows = tx.all(sql, params) if tx else self.db.query(sql, params)
        return Node.from_row(rows[0]) if rows else None

    def nodes_by_token_hashes(self, tx: Tx, token_hashes: list[str]) -> dict[str, Node]:
        """``node_by_token_hash`` for many tokens in one read inside ``tx``, by token hash (an unknown one absent)."""
        found: dict[str, Node] = {}
        for start in range(0, len(token_hashes), 500):
            part = padded(token_hashes[start:start + 500])
            rows = tx.all(f"SELECT * FROM nodes WHERE token_hash IN ({','.join('?' * len(part))})", tuple(part))
            found.update({row["token_hash"]: Node.from_row(row) for row in rows})
        return found

    def heartbeat_views(self, token_hashes: list[str]) -> dict[str, dict]:
        """What heartbeats are answered from, for many tokens in one read, by token hash (an unknown token is
        absent): each token's node (id, job_id, attempt, rank, state), its job's ``job_state``,
        ``cancel_requested`` and ``spec`` (a StoredJob, fixed at submit), and whether the node's attempt is the
        job's running one (``attempt_current``), on spot (``attempt_spot``) and on notice (``attempt_on_notice``);
        a prepared replacement (attempt 0) has ``prepared_for``."""
        token_hashes = padded(token_hashes)
        marks = ",".join("?" * len(token_hashes))
        rows = self.db.query(
            f"""SELECT n.id, n.job_id, n.attempt, n.rank, n.state, n.token_hash, n.prepared_for,
                   j.state AS job_state, j.cancel_requested, j.spec, a.spot AS attempt_spot,
                   CASE WHEN a.notice IS NULL THEN 0 ELSE 1 END AS attempt_on_notice,
                   CASE WHEN a.end_reason = 'running' AND NOT EXISTS (
                       SELECT 1 FROM attempts b WHERE b.job_id = n.job_id AND b.attempt > n.attempt)
                   THEN 1 ELSE 0 END AS attempt_current
               FROM nodes n JOIN jobs j ON j.id = n.job_id
                   LEFT JOIN attempts a ON a.job_id = n.job_id AND a.attempt = n.attempt
               WHERE n.token_hash IN ({marks})""", tuple(token_hashes))
        return {row["token_hash"]: {**decode(row, NODE_COLUMNS), "job_state": row["job_state"],
                                    "cancel_requested": _timestamp_or_none(row["cancel_requested"]),
                                    "spec": load_stored_job(row["spec"]), "attempt_spot": FLAG(row["attempt_spot"]),
                                    "attempt_on_notice": bool(row["attempt_on_notice"]),
                                    "attempt_current": bool(row["attempt_current"])} for row in rows}

    def nodes(self, states: tuple[str, ...] = LIVE_NODE_STATES, job_id: str | None = None) -> list[Node]:
        marks = ",".join("?" * len(states))
        sql = f"SELECT * FROM nodes WHERE state IN ({marks})"
        params: tuple = states
        if job_id:
            sql += " AND job_id = ?"
            params = (*states, job_id)
        return [Node.from_row(r) for r in self.db.query(sql + " ORDER BY created_at", params)]

    def watched_nodes(self, states: tuple[str, ...]) -> list[dict]:
        """Nodes in ``states`` with only what watching them needs (no offer, no progress to decode):
        id, job_id, attempt, rank, provider, provider_ref, terminate_at."""
        marks = ",".join("?" * len(states))
        rows = self.db.query("SELECT id, job_id, attempt, rank, provider, provider_ref, terminate_at FROM nodes "
                             f"WHERE state IN ({marks}) ORDER BY created_at", states)
        return [decode(r, NODE_COLUMNS) for r in rows]

    def has_unterminated_node(self, tx: Tx, job_id: str) -> bool:
        """Does a node still hold the job back from its next launch (any but a terminated or draining one)?"""
        return tx.one("SELECT 1 AS x FROM nodes WHERE job_id = ? AND state NOT IN (?, ?)",
                      (job_id, NODE_TERMINATED, NODE_DRAINING)) is not None

    def drain_node(self, tx: Tx, node_id: str, until: float) -> None:
        """The node's attempt was handed over: it runs on until its exit report, and is reclaimed by ``until``."""
        node = self.node(node_id, tx)
        if node is None or node.state != NODE_RUNNING:
            return
        terminate_at = min(node.terminate_at or until, until)
        self.update_node(tx, node_id, state=NODE_DRAINING, terminate_at=terminate_at)

    def close_drained_attempt(self, tx: Tx, job_id: str, attempt: int, exit_code: int | None) -> None:
        """A handed-over attempt's process has exited: its exit code (the attempt ended at the handover)."""
        tx.execute("UPDATE attempts SET exit_code = COALESCE(exit_code, ?) WHERE job_id = ? AND attempt = ?",
                   (exit_code, job_id, attempt))

    def release_job_nodes(self, tx: Tx, job_id: str, attempt: int | None = None) -> list[str]:
        """Mark a job's launching or running nodes (of one attempt, or all) for termination; return their ids."""
        sql = "SELECT id FROM nodes WHERE job_id = ? AND state IN (?, ?)"
        params: tuple = (job_id, NODE_LAUNCHING, NODE_RUNNING)
        if attempt is not None:
            sql, params = sql + " AND attempt = ?", (*params, attempt)
        ids = [row["id"] for row in tx.all(sql + " ORDER BY id", params)]
        for node_id in ids:
            self.update_node(tx, node_id, state=NODE_TERMINATING)
        return ids

    def update_node(self, tx: Tx, node_id: str, **fields) -> None:
        for key in ("progress",):
            if key in fields and not isinstance(fields[key], (str, type(None))):
                fields[key] = json.dumps(fields[key])
        assignments = ", ".join(f"{key} = ?" for key in fields)
        tx.execute(f"UPDATE nodes SET {assignments} WHERE id = ?", (*fields.values(), node_id))

    def note_first_registration(self, tx: Tx, node_id: str, now: float) -> None:
        """The node's agent registered: the first time ends its boot (a kept gang node registers every attempt)."""
        tx.execute("UPDATE nodes SET first_registered_at = COALESCE(first_registered_at, ?) WHERE id = ?",
                   (now, node_id))

    def record_setup(self, tx: Tx, node_id: str, started_at: float, ended_at: float | None) -> None:
        """When the job's `setup` started on the node and (once it has) ended: the node's own clock."""
        tx.execute("UPDATE nodes SET setup_started_at = ?, setup_ended_at = ? WHERE id = ?",
                   (started_at, ended_at, node_id))

    def record_heartbeats(self, tx: Tx, beats: list[tuple[str, float, str]]) -> None:
        """Each node's newest heartbeat: (node id, when, progress as JSON text), in one statement. A beat older than
        the one stored is not written: controllers (the workers of one) flush their own beats each on its own
        clock, and a node's beats reach whichever its connection of the moment reaches."""
        tx.execute_many("UPDATE nodes SET last_heartbeat = ?, progress = ? "
                        "WHERE id = ? AND (last_heartbeat IS NULL OR last_heartbeat <= ?)",
                        [(when, progress, node_id, when) for node_id, when, progress in beats])

    def write_heartbeats(self, beats: list[tuple[str, float, str]]) -> set[str]:
        """``record_heartbeats`` in a transaction of its own; return the ids of the nodes whose beats it skipped
        because another transaction held their rows (none on SQLite): to be written by a later flush.

        On Postgres a heartbeat is not a serialized write (at 1,000 nodes the flush held the write lock a sixth
        of the time, and the slowest reports had waited behind it). It never waits for a lock either: it updates
        only the rows it could lock at once (``FOR UPDATE SKIP LOCKED``), so a serialized transaction holding some
        of these rows, and updating others after them, cannot deadlock with it. Waiting on such a row while
        holding the rest would make a cycle with any transaction that takes the same rows in another order."""
        if self.db.kind != "postgres":  # SQLite has one writer at a time: no row is ever held by another
            with self.db.transaction() as tx:
                self.record_heartbeats(tx, beats)
            return set()
        rows = padded(beats)  # one statement text per power of two (a repeated beat changes nothing)
        with self.db.transaction(serialized=False) as tx:
            skipped = tx.all(_HEARTBEATS_UNLESS_LOCKED.format(beats=",".join(["(?, CAST(? AS REAL), ?)"] * len(rows))),
                             tuple(value for beat in rows for value in beat))
        return {row["id"] for row in skipped}

    # --- events -----------------------------------------------------------
    def add_event(self, tx: Tx, job_id: str, kind: str, message: str, attempt: int | None = None,
                  now: float | None = None) -> None:
        add_event(tx, job_id, kind, message, attempt=attempt, now=now)

    def last_event(self, job_id: str, kind: str) -> Event | None:
        rows = self.db.query("SELECT * FROM events WHERE job_id = ? AND kind = ? ORDER BY id DESC LIMIT 1",
                             (job_id, kind))
        return Event.from_row(rows[0]) if rows else None

    def events(self, job_id: str, after_id: int = 0) -> list[Event]:
        rows = self.db.query("SELECT * FROM events WHERE job_id = ? AND id > ? ORDER BY id", (job_id, after_id))
        return [Event.from_row(row) for row in rows]

    def running_attempts_events(self, job_ids: list[str], kinds: tuple[str, ...]) -> dict[str, list[Event]]:
        """The events of ``kinds`` recorded for the running attempt of each of many jobs (a few queries, not one
        per job), each job's in order: what a listing shows on each job's current attempt."""
        found: dict[str, list[Event]] = {job_id: [] for job_id in job_ids}
        kind_marks = ",".join("?" * len(kinds))
        for start in range(0, len(job_ids), 500):
            chunk = tuple(job_ids[start:start + 500])
            rows = self.db.query(
                f"SELECT e.* FROM events e JOIN attempts a ON a.job_id = e.job_id AND a.attempt = e.attempt "
                f"WHERE a.end_reason = 'running' AND e.job_id IN ({','.join('?' * len(chunk))}) "
                f"AND e.kind IN ({kind_marks}) ORDER BY e.id", chunk + tuple(kinds))
            for row in rows:
                found[row["job_id"]].append(Event.from_row(row))
        return found


# Postgres only: the beats whose node rows this transaction could lock at once are written (each unless the stored
# beat is newer); the ids of the existing rows it could not lock are returned (a plain read: it does not wait).
_HEARTBEATS_UNLESS_LOCKED = """
WITH beats (id, at, progress) AS (VALUES {beats}),
     mine AS (SELECT id FROM nodes WHERE id IN (SELECT id FROM beats) FOR UPDATE SKIP LOCKED),
     written AS (UPDATE nodes SET last_heartbeat = beats.at, progress = beats.progress FROM beats
                 WHERE nodes.id = beats.id AND nodes.id IN (SELECT id FROM mine)
                 AND (nodes.last_heartbeat IS NULL OR nodes.last_heartbeat <= beats.at))
SELECT id FROM nodes WHERE id IN (SELECT id FROM beats) AND id NOT IN (SELECT id FROM mine)"""


# --- the heartbeat's lean reads (heartbeat_views, watched_nodes): dicts of a few node columns, typed here ---------
def _opt(kind: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else kind(value)


def _json_field(value):
    return json.loads(value) if value else None


def _timestamp_or_none(value):
    """A time column that uses 0 for "never" (``cancel_requested``): the unix time, or None."""
    return float(value) if value else None


TEXT, INT, REAL, FLAG = _opt(str), _opt(int), _opt(float), _opt(bool)

NODE_COLUMNS: dict[str, Callable[[Any], Any]] = {
    "id": TEXT, "job_id": TEXT, "attempt": INT, "provider": TEXT, "state": TEXT, "token_hash": TEXT,
    "offer": _json_field, "spot": FLAG, "provider_ref": TEXT, "created_at": REAL, "registered_at": REAL,
    "last_heartbeat": REAL, "progress": _json_field, "terminate_at": REAL, "terminated_at": REAL, "rank": INT,
    "launched_at": REAL, "first_registered_at": REAL, "setup_started_at": REAL, "setup_ended_at": REAL,
    "prepared_for": INT, "ready_at": REAL,
}


def decode(row: dict, columns: dict[str, Callable[[Any], Any]]) -> dict:
    """A row with each column converted to its declared type; a column not declared passes through unchanged."""
    return {key: columns[key](value) if key in columns else value for key, value in row.items()}
