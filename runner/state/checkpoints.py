"""Durable checkpoints the agents report, written many at once (a report group's, runner/controller/event_api.py).

What one report does, whatever the others of its group: it is refused when a newer attempt of its job exists
(fencing: a superseded attempt's checkpoint is never handed over); else the job keeps it unless the job already
holds a later step (a step never goes backwards), the attempt's ``checkpoint_step`` becomes the larger of the
two, and its commit seconds, where reported, are stored as a measurement once per key. Reports of one job in a
group come out as they would one after the other: the job keeps the report of the highest step, the last of them
where several share it.

On Postgres the whole group is one statement, sent with its savepoint in one round trip (every round trip waits
for the server, and under load for the interpreter the event loop holds too), and with the transaction's COMMIT
where nothing follows it; on SQLite, where a statement is a call, a few statements for the group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .db import Tx, padded
from .measurements import Measurement


@dataclass(frozen=True)
class CheckpointReport:
    """A durable checkpoint of ``job_id``'s ``attempt``: ``checkpoint`` is what the job keeps (with its ``step``),
    ``measurement`` its commit seconds, if reported."""

    job_id: str
    attempt: int
    checkpoint: dict
    measurement: Measurement | None = None

    @property
    def step(self) -> int:
        return int(self.checkpoint["step"])


@dataclass(frozen=True)
class Recorded:
    """``accepted``: per report, in order, False where fenced. ``measurements``: how many observations the
    measurements table holds now (None when no report was accepted)."""

    accepted: list[bool]
    measurements: int | None


def record_checkpoints(tx: Tx, reports: list[CheckpointReport], postgres: bool, then_commit: bool = False) -> Recorded:
    """Write ``reports`` in ``tx`` (see the module's docstring), in a savepoint of their own: where that fails,
    nothing of them is kept, the error is raised, and the transaction goes on. ``then_commit``: nothing follows in
    ``tx``, so on Postgres its COMMIT goes out with the statement (``Tx.all_in_savepoint_then_commit``)."""
    if not reports:
        return Recorded([], None)
    if postgres:
        return _in_one_statement(tx, reports, then_commit)
    with tx.savepoint():
        return _statement_by_statement(tx, reports)


def _in_one_statement(tx: Tx, reports: list[CheckpointReport], then_commit: bool) -> Recorded:
    rows = padded(list(enumerate(reports)))  # a repeated report changes nothing (see _ONE_STATEMENT)
    values = []
    for i, report in rows:
        m = report.measurement
        values += [i, report.job_id, report.attempt, report.step, json.dumps(report.checkpoint),
                   *((m.key, m.name, m.value, json.dumps(m.labels, sort_keys=True), m.time) if m else (None,) * 5)]
    send = tx.all_in_savepoint_then_commit if then_commit else tx.all_in_savepoint
    kept = send(_ONE_STATEMENT.format(rows=",".join([_ROW] * len(rows))), tuple(values))
    accepted = {row["i"] for row in kept}
    return Recorded([i in accepted for i in range(len(reports))], int(kept[0]["measurements"]) if kept else None)


_ROW = ("(CAST(? AS INTEGER), ?, CAST(? AS INTEGER), CAST(? AS INTEGER), ?, CAST(? AS TEXT), CAST(? AS TEXT), "
        "CAST(? AS REAL), CAST(? AS TEXT), CAST(? AS REAL))")
# Postgres only. ``kept``: the reports no newer attempt fences. ``newest``: per job, the report of the highest step,
# the last of them on a tie. The measurements table's count is read before this statement's inserts (one snapshot
# for the whole statement), so the rows it inserted are added. Duplicate rows (the padding, a retry in the same
# group) are taken once by DISTINCT ON / GROUP BY.
_ONE_STATEMENT = """
WITH reports (i, job_id, attempt, step, checkpoint, m_key, m_name, m_value, m_labels, m_time) AS (VALUES {rows}),
     kept AS (SELECT * FROM reports r WHERE NOT EXISTS (
                  SELECT 1 FROM attempts a WHERE a.job_id = r.job_id AND a.attempt > r.attempt)),
     newest AS (SELECT DISTINCT ON (job_id) job_id, step, checkpoint FROM kept ORDER BY job_id, step DESC, i DESC),
     jobs_moved AS (UPDATE jobs SET step = newest.step, checkpoint = newest.checkpoint FROM newest
                    WHERE jobs.id = newest.job_id AND jobs.step <= newest.step),
     attempts_moved AS (UPDATE attempts SET checkpoint_step = GREATEST(COALESCE(attempts.checkpoint_step, 0), best.step)
                        FROM (SELECT job_id, attempt, MAX(step) AS step FROM kept GROUP BY job_id, attempt) best
                        WHERE attempts.job_id = best.job_id AND attempts.attempt = best.attempt),
     measured AS (INSERT INTO measurements (key, job_id, attempt, time, name, labels, value)
                  SELECT DISTINCT ON (m_key) m_key, job_id, attempt, m_time, m_name, m_labels, m_value FROM kept
                  WHERE m_key IS NOT NULL ORDER BY m_key, i
                  ON CONFLICT DO NOTHING RETURNING 1)
SELECT DISTINCT i, (SELECT COUNT(*) FROM measurements) + (SELECT COUNT(*) FROM measured) AS measurements FROM kept"""


def _statement_by_statement(tx: Tx, reports: list[CheckpointReport]) -> Recorded:
    """The same writes as :data:`_ONE_STATEMENT`, in portable SQL: the fence in one read, then one statement per
    table, each looped in the driver."""
    job_ids = padded(list(dict.fromkeys(report.job_id for report in reports)))
    latest = {row["job_id"]: row["a"] for row in tx.all(
        f"SELECT job_id, MAX(attempt) AS a FROM attempts WHERE job_id IN ({','.join('?' * len(job_ids))}) "
        "GROUP BY job_id", tuple(job_ids))}
    accepted = [latest.get(r.job_id) is None or r.attempt >= latest[r.job_id] for r in reports]
    kept = [report for report, ok in zip(reports, accepted) if ok]
    if not kept:
        return Recorded(accepted, None)
    newest: dict[str, CheckpointReport] = {}
    best: dict[tuple[str, int], int] = {}
    for report in kept:  # in order: a later report of the same step replaces an earlier one
        if report.job_id not in newest or report.step >= newest[report.job_id].step:
            newest[report.job_id] = report
        best[(report.job_id, report.attempt)] = max(best.get((report.job_id, report.attempt), 0), report.step)
    tx.execute_many("UPDATE jobs SET step = ?, checkpoint = ? WHERE id = ? AND step <= ?",
                    [(r.step, json.dumps(r.checkpoint), job_id, r.step) for job_id, r in newest.items()])
    tx.execute_many("UPDATE attempts SET checkpoint_step = CASE WHEN COALESCE(checkpoint_step, 0) > ? "
                    "THEN checkpoint_step ELSE ? END WHERE job_id = ? AND attempt = ?",
                    [(step, step, job_id, attempt) for (job_id, attempt), step in best.items()])
    measured = [(m.key, r.job_id, r.attempt, m.time, m.name, json.dumps(m.labels, sort_keys=True), float(m.value))
                for r in kept if (m := r.measurement) is not None]
    if measured:
        tx.execute_many("INSERT OR IGNORE INTO measurements (key, job_id, attempt, time, name, labels, value) "
                        "VALUES (?,?,?,?,?,?,?)", measured)
    return Recorded(accepted, int(tx.one("SELECT COUNT(*) AS n FROM measurements")["n"]))
