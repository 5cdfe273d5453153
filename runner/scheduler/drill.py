"""The resume drill, controller side: a drill attempt ends, the next one starts on the same node.

The agent takes a real emergency checkpoint at the drill time and stops the job; the controller ends
that attempt with ``end_reason: drill`` and at once opens the next attempt on the same node, which
must restore exactly the drill's step. The agent reports the verdict; a failed drill fails the job.
"""

from __future__ import annotations

import time

from ..state import Store, ledger
from ..state.rows import Attempt, Node
from .attempts import end_attempt
from .states import FAILED, PROVISIONING, RECOVERING, RUNNING
from .transitions import AttemptEnd, transition


def drill_due(attempts: list[Attempt]) -> bool:
    """The drill runs once per job: until some attempt carries a drill result."""
    return not any(a.drill for a in attempts)


def restart_after_drill(store: Store, node: Node, checkpoint_step: int, seconds: float,
                        exit_code: int | None = None) -> int | None:
    """End the drill attempt and open the next one on the same node; return its number (None if stale)."""
    now = time.time()
    job_id = node.job_id
    with store.db.transaction() as tx:
        current = store.current_attempt(job_id, tx)
        if current is None or current.attempt != node.attempt:
            return None
        drill = {"passed": None, "checkpoint_step": checkpoint_step, "resumed_step": None, "seconds": None,
                 "checkpoint_seconds": round(seconds, 3)}
        transition(tx, job_id, RECOVERING, now=now, message="resume drill: emergency checkpoint taken; restarting",
                   attempt_end=AttemptEnd(attempt=node.attempt, reason="drill", checkpoint_step=checkpoint_step,
                                          lost_seconds=0.0, drill=drill, exit_code=exit_code))
        resumed = (store.job(job_id, tx).checkpoint or {}).get("step", 0)
        attempt = store.insert_attempt(tx, job_id, node.id, node.offer, node.spot, resumed, now)
        store.mark_attempt_running(tx, job_id, attempt, now)
        ledger.record_registration(tx, job_id, attempt, node.rank, None)  # the same node: up, and set up, already
        store.update_node(tx, node.id, attempt=attempt)
        transition(tx, job_id, PROVISIONING, now=now, message=f"resume drill: attempt {attempt} on the same node")
        transition(tx, job_id, RUNNING, now=now, message=f"attempt {attempt} running (resume drill)")
    return attempt


def record_drill_result(store: Store, node: Node, result: dict) -> str | None:
    """Store the verdict on the drill attempt; a failed drill ends the job as FAILED."""
    job_id = node.job_id
    with store.db.transaction() as tx:
        drilled = store.last_drill_attempt(tx, job_id)
        target = drilled if drilled is not None else node.attempt
        store.set_attempt_drill(tx, job_id, target, result, result.get("message"))
    if result.get("passed") is False:
        return end_attempt(store, job_id, node.attempt, "failed", message=f"resume drill failed: {result.get('message')}",
                           force_state=FAILED)
    return None
