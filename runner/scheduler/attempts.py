"""Ending an attempt: restart-log fields, the job's next state and the node's release, in one transaction."""

from __future__ import annotations

import time

from ..state import Store
from ..state.store import NODE_LAUNCHING, NODE_RUNNING, NODE_TERMINATING
from .outcomes import lost_seconds, next_state
from .transitions import AttemptEnd, transition


def end_attempt(store: Store, job_id: str, attempt: int, reason: str, *, now: float | None = None,
                exit_code: int | None = None, notice: dict | None = None, drill: dict | None = None,
                message: str | None = None, force_state: str | None = None) -> str | None:
    """End a running attempt and move the job on; return the new state, or None if already ended."""
    now = now or time.time()
    with store.db.transaction() as tx:
        job = store.job(job_id, tx)
        current = store.current_attempt(job_id, tx)
        if job is None or current is None or current["attempt"] != attempt:
            return None
        notice = notice or current["notice"]
        if reason in ("failed", "lost") and notice:
            reason = "preempted"  # the node was on notice: whatever happened next is the preemption
        checkpoint = job["checkpoint"] or {}
        own_checkpoint = checkpoint.get("attempt") == attempt
        commit_at = checkpoint.get("time") if own_checkpoint else None
        restored = tx.one("SELECT MIN(time) AS t FROM events WHERE job_id = ? AND attempt = ? AND kind = 'restored'",
                          (job_id, attempt))
        working_since = (restored and restored["t"]) or current["running_at"]
        recovery = job["spec"]["recovery"]
        state, why = next_state(
            reason, preemptions=job["preemptions"], failures=job["failures"],
            max_preemptions=recovery["max_preemptions"], max_failures=recovery["max_failures"],
        )
        if force_state is not None:
            state, why = force_state, message or why
        end = AttemptEnd(
            attempt=attempt, reason=reason, exit_code=exit_code, notice=notice,
            lost_seconds=lost_seconds(reason, now, working_since, commit_at,
                                      stopped_at_commit=own_checkpoint and bool(checkpoint.get("emergency"))),
            drill=drill, message=message or why,
        )
        transition(tx, job_id, state, now=now, message=why, attempt_end=end)
        release_nodes(store, tx, job_id, attempt)
        return state


def release_nodes(store: Store, tx, job_id: str, attempt: int | None = None) -> None:
    """Mark a job's live nodes (of one attempt, or all) for termination by the reconciler."""
    for node in tx.all("SELECT id, attempt, state FROM nodes WHERE job_id = ?", (job_id,)):
        if node["state"] in (NODE_LAUNCHING, NODE_RUNNING) and (attempt is None or node["attempt"] == attempt):
            store.update_node(tx, node["id"], state=NODE_TERMINATING)
