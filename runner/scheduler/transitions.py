"""The one function through which every job-state change goes.

It checks the change against :data:`ALLOWED`, ends the current attempt in the same transaction
(which is what the restart log is made of), and writes an event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from ..state import Tx
from ..state import job_changes as rows
from ..state.values import Notice
from .states import ALLOWED, END_REASONS, TERMINAL
from ..errors import RunnerError

log = structlog.get_logger(__name__)


class InvalidTransition(RunnerError):
    """A state change the table does not allow."""


@dataclass
class AttemptEnd:
    """How an attempt ended: the restart-log fields known at that moment."""

    attempt: int
    reason: str
    exit_code: int | None = None
    notice: Notice | None = None
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
    from_state = rows.job_state(tx, job_id)
    if from_state is None:
        raise InvalidTransition(f"job {job_id} does not exist")
    if to_state not in ALLOWED[from_state]:
        raise InvalidTransition(f"job {job_id}: {from_state} -> {to_state} is not allowed")
    rows.set_job_state(tx, job_id, to_state, now, message, ended=to_state in TERMINAL)
    if attempt_end is not None:
        _end_attempt(tx, job_id, attempt_end, now)
    rows.add_event(tx, job_id, "state", message, attempt=attempt_end.attempt if attempt_end else None, now=now,
                   from_state=from_state, to_state=to_state)
    log.info("job state", job=job_id, from_state=from_state, to_state=to_state, why=message)
    return from_state


def _end_attempt(tx: Tx, job_id: str, end: AttemptEnd, now: float) -> None:
    if not rows.end_attempt(tx, job_id, end.attempt, now, end.reason, exit_code=end.exit_code, notice=end.notice,
                            checkpoint_step=end.checkpoint_step, lost_seconds=end.lost_seconds, drill=end.drill,
                            message=end.message):
        raise InvalidTransition(f"job {job_id}: attempt {end.attempt} is not running")
    counter = {"preempted": "preemptions", "lost": "preemptions", "failed": "failures"}.get(end.reason)
    if counter:
        rows.count_attempt_end(tx, job_id, counter)
