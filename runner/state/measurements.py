"""Reads and writes behind the controller's metrics: agent-reported measurements and restart-log aggregates.

A measurement is one observed value (a checkpoint's commit seconds, a notice's detection latency) with
its label values. Its ``key`` names what was measured, so a report that arrives twice is stored once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from .db import Database, Tx


@dataclass(frozen=True)
class Measurement:
    """One observation as it is stored: what was measured (``key``, unique), the measurement's ``name``, its
    ``value`` and label values, and when it was recorded."""

    key: str
    name: str
    value: float
    labels: dict[str, str]
    time: float


def add_measurement(tx: Tx, key: str, job_id: str, attempt: int | None, name: str, value: float,
                    labels: dict[str, str], now: float) -> bool:
    """Store one observation unless ``key`` was already measured; True when stored now."""
    return tx.execute(
        "INSERT OR IGNORE INTO measurements (key, job_id, attempt, time, name, labels, value) VALUES (?,?,?,?,?,?,?)",
        (key, job_id, attempt, now, name, json.dumps(labels, sort_keys=True), float(value)),
    ) == 1


def measurements(db: Database) -> list[dict]:
    """Every observation still kept one by one, as ``{"name", "labels", "value"}``, labels decoded."""
    rows = db.query("SELECT name, labels, value FROM measurements ORDER BY name, key")
    return [{**row, "labels": json.loads(row["labels"])} for row in rows]


def fold_oldest(tx: Tx, keep: int, buckets: Callable[[str], tuple[float, ...] | None]) -> int:
    """Fold all but the newest ``keep`` observations into per-bucket totals and delete them; return how many.

    ``buckets(name)``: the histogram bounds of a measurement name (None: drop it uncounted). The rollup keeps,
    per name, labels and bound, how many folded observations were at most that bound; bound ``+Inf`` holds
    the count and the sum. A report of a folded key that arrives again would be counted again: keys are
    folded long after the agent's retries have stopped. The folded rows are added up here first, so the
    rollup takes one upsert per name, labels and bound, whatever the number of rows (all inside the caller's
    write transaction).
    """
    rows = tx.all("SELECT key, name, labels, value FROM measurements ORDER BY time DESC, key DESC "
                  "LIMIT -1 OFFSET ?", (keep,))
    totals: dict[tuple[str, str, str], list[float]] = {}
    for row in rows:
        bounds = buckets(row["name"])
        if bounds is None:
            continue
        for le in [*(repr(float(b)) for b in bounds if row["value"] <= b), "+Inf"]:
            total = totals.setdefault((row["name"], row["labels"], le), [0, 0.0])
            total[0] += 1
            total[1] += row["value"] if le == "+Inf" else 0.0
    if not rows:
        return 0
    tx.execute_many("INSERT INTO measurement_rollup (name, labels, le, n, total) VALUES (?,?,?,?,?) "
                    "ON CONFLICT(name, labels, le) DO UPDATE SET n = measurement_rollup.n + excluded.n, "
                    "total = measurement_rollup.total + excluded.total",
                    [(name, labels, le, n, total) for (name, labels, le), (n, total) in totals.items()])
    tx.execute_many("DELETE FROM measurements WHERE key = ?", [(row["key"],) for row in rows])
    return len(rows)


def measurement_count(tx: Tx) -> int:
    return tx.one("SELECT COUNT(*) AS n FROM measurements")["n"]


def rollup(db: Database) -> list[dict]:
    """The folded totals as ``{"name", "labels", "le", "n", "total"}``, labels decoded."""
    rows = db.query("SELECT name, labels, le, n, total FROM measurement_rollup ORDER BY name, labels, le")
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
        """SELECT cloud, zone, SUM(price_per_hour * CASE WHEN COALESCE(ended_at, ?) > started_at
                                                         THEN COALESCE(ended_at, ?) - started_at ELSE 0.0 END / 3600.0) AS usd
           FROM attempts GROUP BY cloud, zone ORDER BY cloud, zone""", (now, now))


def attempt_timeline(db: Database) -> list[dict]:
    """Every attempt's ``job_id``, ``attempt``, ``end_reason``, ``running_at`` and ``ended_at``, in order."""
    return db.query("SELECT job_id, attempt, end_reason, running_at, ended_at FROM attempts ORDER BY job_id, attempt")
