"""The writes behind a job's state change, inside the caller's transaction.

runner/scheduler/transitions.py checks the change against its table and calls these; nothing else
changes a job's state or ends an attempt.
"""

from __future__ import annotations

import json
import time

from .db import Tx
from .values import Notice

JOB_COUNTERS = ("preemptions", "failures")


def encode_json(value) -> str | None:
    return None if value is None else json.dumps(value)


def job_state(tx: Tx, job_id: str) -> str | None:
    row = tx.one("SELECT state FROM jobs WHERE id = ?", (job_id,))
    return row["state"] if row else None


def set_job_state(tx: Tx, job_id: str, state: str, now: float, message: str, ended: bool) -> None:
    tx.execute("UPDATE jobs SET state = ?, updated_at = ?, ended_at = ?, message = ? WHERE id = ?",
               (state, now, now if ended else None, message, job_id))


def end_attempt(tx: Tx, job_id: str, attempt: int, now: float, reason: str, *, exit_code: int | None,
                notice: Notice | None, checkpoint_step: int | None, lost_seconds: float | None,
                drill: dict | None, message: str | None) -> bool:
    """Write a running attempt's end (its restart-log fields); False when it was not running."""
    return tx.execute(
        """UPDATE attempts SET ended_at = ?, end_reason = ?, exit_code = COALESCE(?, exit_code),
               notice = COALESCE(?, notice), checkpoint_step = COALESCE(?, checkpoint_step),
               lost_seconds = ?, drill = COALESCE(?, drill), message = COALESCE(?, message)
           WHERE job_id = ? AND attempt = ? AND end_reason = 'running'""",
        (now, reason, exit_code, encode_json(notice and notice.to_json()), checkpoint_step, lost_seconds, encode_json(drill), message,
         job_id, attempt),
    ) > 0


def count_attempt_end(tx: Tx, job_id: str, counter: str) -> None:
    """One more preemption or failure on the job's counters."""
    if counter not in JOB_COUNTERS:
        raise ValueError(f"not a job counter: {counter!r}")
    tx.execute(f"UPDATE jobs SET {counter} = {counter} + 1 WHERE id = ?", (job_id,))


def add_event(tx: Tx, job_id: str, kind: str, message: str, *, attempt: int | None = None, now: float | None = None,
              from_state: str | None = None, to_state: str | None = None) -> None:
    tx.execute(
        "INSERT INTO events (job_id, attempt, time, kind, from_state, to_state, message) VALUES (?,?,?,?,?,?,?)",
        (job_id, attempt, now or time.time(), kind, from_state, to_state, message))
