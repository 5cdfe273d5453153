"""The one function through which every job-state change goes.

It checks the change against :data:`ALLOWED`, ends the current attempt in the same transaction
(which is what the restart log is made of), and writes an event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import structlog

from ..state import Tx
from .states import ALLOWED, END_REASONS, TERMINAL

log = structlog.get_logger(__name__)


class InvalidTransition(Exception):
    """A state change the table does not allow."""


@dataclass
class AttemptEnd:
    """How an attempt ended: the restart-log fields known at that moment."""

    attempt: int
    reason: str
    exit_code: int | None = None
    notice: dict | None = None
    checkpoint_step: int | None = None
    lost_seconds: float | None = None
    drill: dict | None = None
    message: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.reason not in END_REASONS or self.reason == "running":
            raise ValueError(f"not an end reason: {self.reason!r}")


def transition(tx: Tx, job_id: str, to_state: str, *, now: float, message: str,
               attempt_end: AttemptEnd | None = None) -> str:
    """Move a job to ``to_state``; return the state it left. Raises InvalidTransition."""
    row = tx.one("SELECT state FROM jobs WHERE id = ?", (job_id,))
    if row is None:
        raise InvalidTransition(f"job {job_id} does not exist")
    from_state = row["state"]
    if to_state not in ALLOWED[from_state]:
        raise InvalidTransition(f"job {job_id}: {from_state} -> {to_state} is not allowed")
    tx.execute(
        "UPDATE jobs SET state = ?, updated_at = ?, ended_at = ?, message = ? WHERE id = ?",
        (to_state, now, now if to_state in TERMINAL else None, message, job_id),
    )
    if attempt_end is not None:
        _end_attempt(tx, job_id, attempt_end, now)
    tx.execute(
        "INSERT INTO events (job_id, attempt, time, kind, from_state, to_state, message) VALUES (?,?,?,?,?,?,?)",
        (job_id, attempt_end.attempt if attempt_end else None, now, "state", from_state, to_state, message),
    )
    log.info("job state", job=job_id, from_state=from_state, to_state=to_state, why=message)
    return from_state


def _end_attempt(tx: Tx, job_id: str, end: AttemptEnd, now: float) -> None:
    changed = tx.execute(
        """UPDATE attempts SET ended_at = ?, end_reason = ?, exit_code = COALESCE(?, exit_code),
               notice = COALESCE(?, notice), checkpoint_step = COALESCE(?, checkpoint_step),
               lost_seconds = ?, drill = COALESCE(?, drill), message = COALESCE(?, message)
           WHERE job_id = ? AND attempt = ? AND end_reason = 'running'""",
        (now, end.reason, end.exit_code, _json(end.notice), end.checkpoint_step, end.lost_seconds,
         _json(end.drill), end.message, job_id, end.attempt),
    )
    if not changed:
        raise InvalidTransition(f"job {job_id}: attempt {end.attempt} is not running")
    counter = {"preempted": "preemptions", "lost": "preemptions", "failed": "failures"}.get(end.reason)
    if counter:
        tx.execute(f"UPDATE jobs SET {counter} = {counter} + 1 WHERE id = ?", (job_id,))


def _json(value) -> str | None:
    return None if value is None else json.dumps(value)
