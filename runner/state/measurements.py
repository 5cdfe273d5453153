"""Reads and writes behind the controller's metrics: agent-reported measurements and restart-log aggregates.

A measurement is one observed value (a checkpoint's commit seconds, a notice's detection latency) with
its label values. Its ``key`` names what was measured, so a report that arrives twice is stored once.
"""

from __future__ import annotations

import json

from .db import Database, Tx


def add_measurement(tx: Tx, key: str, job_id: str, attempt: int | None, name: str, value: float,
                    labels: dict[str, str], now: float) -> bool:
    """Store one observation unless ``key`` was already measured; True when stored now."""
    return tx.execute(
        "INSERT OR IGNORE INTO measurements (key, job_id, attempt, time, name, labels, value) VALUES (?,?,?,?,?,?,?)",
        (key, job_id, attempt, now, name, json.dumps(labels, sort_keys=True), float(value)),
    ) == 1


def measurements(db: Database) -> list[dict]:
    """Every observation as ``{"name", "labels", "value"}``, labels decoded."""
    rows = db.query("SELECT name, labels, value FROM measurements ORDER BY name, key")
    return [{**row, "labels": json.loads(row["labels"])} for row in rows]


def job_state_counts(db: Database) -> dict[str, int]:
    return {row["state"]: row["n"] for row in db.query("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")}


def ended_attempt_counts(db: Database) -> list[dict]:
    """Ended attempts per ``cloud``, ``zone`` and ``end_reason`` (as ``n``)."""
    return db.query(
        """SELECT cloud, zone, end_reason, COUNT(*) AS n FROM attempts WHERE end_reason != 'running'
           GROUP BY cloud, zone, end_reason ORDER BY cloud, zone, end_reason""")


def running_attempt_counts(db: Database) -> list[dict]:
    return db.query(
        """SELECT cloud, zone, COUNT(*) AS n FROM attempts WHERE end_reason = 'running'
           GROUP BY cloud, zone ORDER BY cloud, zone""")


def cost_by_zone(db: Database, now: float) -> list[dict]:
    """USD per ``cloud`` and ``zone``: per-second billing from launch to end, or to ``now`` while running."""
    return db.query(
        """SELECT cloud, zone, SUM(price_per_hour * MAX(0.0, COALESCE(ended_at, ?) - started_at) / 3600.0) AS usd
           FROM attempts GROUP BY cloud, zone ORDER BY cloud, zone""", (now,))


def attempt_timeline(db: Database) -> list[dict]:
    """Every attempt's ``job_id``, ``attempt``, ``end_reason``, ``running_at`` and ``ended_at``, in order."""
    return db.query("SELECT job_id, attempt, end_reason, running_at, ended_at FROM attempts ORDER BY job_id, attempt")
