"""Reads and writes of jobs, attempts, nodes and events: the SQL lives here and nowhere else."""

from __future__ import annotations

import json
import time

from .db import Database, Tx

NODE_LAUNCHING = "launching"      # row written, provider launch may or may not have happened
NODE_RUNNING = "running"          # provider confirmed the launch
NODE_TERMINATING = "terminating"  # release requested
NODE_TERMINATED = "terminated"    # provider confirmed it is gone
LIVE_NODE_STATES = (NODE_LAUNCHING, NODE_RUNNING, NODE_TERMINATING)


class Store:
    """Typed access to the controller's tables; rows come back as dicts with JSON fields decoded."""

    def __init__(self, db: Database):
        self.db = db

    # --- jobs -------------------------------------------------------------
    def insert_job(self, tx: Tx, job_id: str, name: str, spec: dict, state: str, now: float) -> None:
        tx.execute(
            "INSERT INTO jobs (id, name, spec, state, created_at, updated_at) VALUES (?,?,?,?,?,?)",
            (job_id, name, json.dumps(spec), state, now, now),
        )
        tx.execute(
            "INSERT INTO events (job_id, time, kind, to_state, message) VALUES (?,?,?,?,?)",
            (job_id, now, "state", state, "submitted"),
        )

    def job(self, job_id: str, tx: Tx | None = None) -> dict | None:
        sql, params = "SELECT * FROM jobs WHERE id = ?", (job_id,)
        row = tx.one(sql, params) if tx else next(iter(self.db.query(sql, params)), None)
        return _decode_job(row) if row else None

    def jobs(self, states: tuple[str, ...] | None = None) -> list[dict]:
        if states:
            marks = ",".join("?" * len(states))
            rows = self.db.query(f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY created_at", states)
        else:
            rows = self.db.query("SELECT * FROM jobs ORDER BY created_at")
        return [_decode_job(r) for r in rows]

    def set_job_message(self, tx: Tx, job_id: str, message: str) -> None:
        """Say why a job waits, without a state change (``updated_at`` stays: it is when the wait began)."""
        tx.execute("UPDATE jobs SET message = ? WHERE id = ?", (message, job_id))

    def request_cancel(self, tx: Tx, job_id: str, now: float) -> None:
        """Record when the user asked to cancel (the agent's grace runs from then); a second request keeps the first."""
        tx.execute("UPDATE jobs SET cancel_requested = ? WHERE id = ? AND cancel_requested = 0", (now, job_id))

    def record_checkpoint(self, tx: Tx, job_id: str, attempt: int, checkpoint: dict) -> bool:
        """Remember a committed checkpoint unless a newer attempt has started (fencing)."""
        latest = tx.one("SELECT MAX(attempt) AS a FROM attempts WHERE job_id = ?", (job_id,))
        if latest["a"] is not None and attempt < latest["a"]:
            return False
        tx.execute(
            "UPDATE jobs SET step = ?, checkpoint = ? WHERE id = ? AND step <= ?",
            (checkpoint["step"], json.dumps(checkpoint), job_id, checkpoint["step"]),
        )
        tx.execute(
            "UPDATE attempts SET checkpoint_step = MAX(COALESCE(checkpoint_step, 0), ?) WHERE job_id = ? AND attempt = ?",
            (checkpoint["step"], job_id, attempt),
        )
        return True

    # --- attempts ---------------------------------------------------------
    def insert_attempt(self, tx: Tx, job_id: str, node_id: str, offer: dict, spot: bool,
                       resumed_from_step: int, now: float, num_nodes: int = 1, master_port: int | None = None) -> int:
        """A new attempt; a gang's (``num_nodes`` > 1) names its rank-0 node and per-node price here, and its
        ranks in ``attempt_nodes`` (runner/state/gangs.py)."""
        row = tx.one("SELECT COALESCE(MAX(attempt), 0) + 1 AS n FROM attempts WHERE job_id = ?", (job_id,))
        attempt = row["n"]
        price = offer["spot_price"] if spot else offer["on_demand_price"]
        tx.execute(
            """INSERT INTO attempts (job_id, attempt, node_id, cloud, region, zone, instance_type, spot,
                   price_per_hour, started_at, resumed_from_step, num_nodes, master_port)
               VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)""",
            (job_id, attempt, node_id, offer["cloud"], offer["region"], offer["zone"],
             offer["instance_type"], int(spot), price or 0.0, now, resumed_from_step, num_nodes, master_port),
        )
        return attempt

    def attempts(self, job_id: str, tx: Tx | None = None) -> list[dict]:
        """The job's attempts in order; a gang's carry ``nodes``, its rank assignments in rank order."""
        sql, params = "SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt", (job_id,)
        rows = [_decode_attempt(r) for r in (tx.all(sql, params) if tx else self.db.query(sql, params))]
        if any(r["num_nodes"] > 1 for r in rows):
            sql = "SELECT * FROM attempt_nodes WHERE job_id = ? ORDER BY attempt, rank"
            ranks: dict[int, list[dict]] = {}
            for node in (tx.all(sql, params) if tx else self.db.query(sql, params)):
                ranks.setdefault(node["attempt"], []).append({**node, "spot": bool(node["spot"])})
            for row in rows:
                row["nodes"] = ranks.get(row["attempt"], [])
        return rows

    def current_attempt(self, job_id: str, tx: Tx | None = None) -> dict | None:
        rows = self.attempts(job_id, tx)
        return rows[-1] if rows and rows[-1]["end_reason"] == "running" else None

    def mark_attempt_running(self, tx: Tx, job_id: str, attempt: int, now: float) -> None:
        tx.execute("UPDATE attempts SET running_at = COALESCE(running_at, ?) WHERE job_id = ? AND attempt = ?",
                   (now, job_id, attempt))

    def set_resumed_from(self, tx: Tx, job_id: str, attempt: int, step: int) -> None:
        """Record the step the training really restored (less than handed over when that one failed)."""
        tx.execute("UPDATE attempts SET resumed_from_step = ? WHERE job_id = ? AND attempt = ?",
                   (step, job_id, attempt))

    def set_attempt_notice(self, tx: Tx, job_id: str, attempt: int, notice: dict) -> None:
        tx.execute("UPDATE attempts SET notice = COALESCE(notice, ?) WHERE job_id = ? AND attempt = ?",
                   (json.dumps(notice), job_id, attempt))

    # --- nodes ------------------------------------------------------------
    def insert_node(self, tx: Tx, node_id: str, job_id: str, attempt: int, provider: str,
                    token_hash: str, offer: dict, spot: bool, now: float, rank: int = 0) -> None:
        tx.execute(
            """INSERT INTO nodes (id, job_id, attempt, provider, state, token_hash, offer, spot, created_at, rank)
               VALUES (?,?,?,?,?,?,?,?,?,?)""",
            (node_id, job_id, attempt, provider, NODE_LAUNCHING, token_hash, json.dumps(offer), int(spot), now, rank),
        )

    def node(self, node_id: str, tx: Tx | None = None) -> dict | None:
        sql, params = "SELECT * FROM nodes WHERE id = ?", (node_id,)
        row = tx.one(sql, params) if tx else next(iter(self.db.query(sql, params)), None)
        return _decode_node(row) if row else None

    def node_by_token_hash(self, token_hash: str) -> dict | None:
        rows = self.db.query("SELECT * FROM nodes WHERE token_hash = ?", (token_hash,))
        return _decode_node(rows[0]) if rows else None

    def nodes(self, states: tuple[str, ...] = LIVE_NODE_STATES, job_id: str | None = None) -> list[dict]:
        marks = ",".join("?" * len(states))
        sql = f"SELECT * FROM nodes WHERE state IN ({marks})"
        params: tuple = states
        if job_id:
            sql += " AND job_id = ?"
            params = (*states, job_id)
        return [_decode_node(r) for r in self.db.query(sql + " ORDER BY created_at", params)]

    def update_node(self, tx: Tx, node_id: str, **fields) -> None:
        for key in ("progress",):
            if key in fields and not isinstance(fields[key], (str, type(None))):
                fields[key] = json.dumps(fields[key])
        assignments = ", ".join(f"{key} = ?" for key in fields)
        tx.execute(f"UPDATE nodes SET {assignments} WHERE id = ?", (*fields.values(), node_id))

    # --- events -----------------------------------------------------------
    def add_event(self, tx: Tx, job_id: str, kind: str, message: str, attempt: int | None = None,
                  now: float | None = None) -> None:
        tx.execute("INSERT INTO events (job_id, attempt, time, kind, message) VALUES (?,?,?,?,?)",
                   (job_id, attempt, now or time.time(), kind, message))

    def last_event(self, job_id: str, kind: str) -> dict | None:
        rows = self.db.query("SELECT * FROM events WHERE job_id = ? AND kind = ? ORDER BY id DESC LIMIT 1",
                             (job_id, kind))
        return rows[0] if rows else None

    def events(self, job_id: str, after_id: int = 0) -> list[dict]:
        return self.db.query("SELECT * FROM events WHERE job_id = ? AND id > ? ORDER BY id", (job_id, after_id))


def _decode_job(row: dict) -> dict:
    row = dict(row)
    row["spec"] = json.loads(row["spec"])
    row["checkpoint"] = json.loads(row["checkpoint"]) if row["checkpoint"] else None
    row["cancel_requested"] = float(row["cancel_requested"]) or None  # when the user cancelled (unix), or None
    return row


def _decode_attempt(row: dict) -> dict:
    row = dict(row)
    row["spot"] = bool(row["spot"])
    for key in ("notice", "drill"):
        row[key] = json.loads(row[key]) if row[key] else None
    return row


def _decode_node(row: dict) -> dict:
    row = dict(row)
    row["offer"] = json.loads(row["offer"])
    row["spot"] = bool(row["spot"])
    row["progress"] = json.loads(row["progress"]) if row["progress"] else None
    return row
