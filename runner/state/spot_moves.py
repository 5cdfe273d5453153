"""Reads behind the move from on-demand back to spot (runner/scheduler/spot_return.py).

One query a reconciler tick, decoding no job spec: the scale benchmark (docs/architecture.md) found that
decoding every running job twice a second held the controller's GIL."""

from __future__ import annotations

from dataclasses import dataclass

from .db import Database


@dataclass(frozen=True, slots=True)
class OnDemandAttempt:
    job_id: str
    attempt: int
    move_requested_at: float | None  # when a move to spot was asked of this attempt, else None


def on_demand_attempts(db: Database, job_state: str, move_event: str) -> list[OnDemandAttempt]:
    """The running, registered on-demand attempts of jobs in ``job_state`` with no cancel asked for (with
    when a ``move_event`` asked each to stop)."""
    rows = db.query(
        """SELECT j.id AS job_id, a.attempt AS attempt,
                  (SELECT MAX(e.time) FROM events e
                   WHERE e.job_id = j.id AND e.attempt = a.attempt AND e.kind = ?) AS move_requested_at
           FROM jobs j JOIN attempts a ON a.job_id = j.id
           WHERE j.state = ? AND j.cancel_requested = 0 AND a.end_reason = 'running' AND a.spot = 0
                 AND a.running_at IS NOT NULL
           ORDER BY j.created_at""",
        (move_event, job_state),
    )
    return [OnDemandAttempt(row["job_id"], int(row["attempt"]),
                            None if row["move_requested_at"] is None else float(row["move_requested_at"]))
            for row in rows]
