"""Ending an attempt: restart-log fields, the job's next state and the node's release, in one transaction."""

from __future__ import annotations

import time

from typing import Iterable

from ..state import Store
from ..state.gangs import GangStore
from ..state.rows import Attempt, Node
from ..state.standbys import StandbyStore
from ..state.values import Notice
from ..state.store import NODE_DRAINING, NODE_LAUNCHING, NODE_RUNNING, NODE_TERMINATING
from ..protocol.events import EndReason
from .gang import node_end_reasons, reported_end
from .outcomes import lost_seconds, next_state
from .states import ALLOWED, PENDING, PROVISIONING, RECOVERING, RUNNING, TERMINAL
from .transitions import AttemptEnd, transition


def end_attempt(store: Store, job_id: str, attempt: int, reason: str, *, now: float | None = None,
                exit_code: int | None = None, notice: Notice | None = None, drill: dict | None = None,
                message: str | None = None, force_state: str | None = None, ranks: Iterable[int] = (),
                drain_until: float | None = None, trained_nothing: bool = False,
                unless_finished: bool = False) -> str | None:
    """End a running attempt and move the job on; return the new state, or None if already ended (or spared).

    ``ranks``: of a gang, the node ranks that ended it (a preempted or lost node); while the job goes on
    only their nodes are released and the others are kept for the next attempt.
    ``drain_until``: of a single-node attempt handed over (:func:`hand_over`), the node is not released but
    drains until its exit report, and is reclaimed at that time at the latest.
    ``trained_nothing``: the attempt failed before any training (a command not found): it lost no work.
    ``unless_finished``: of a gang's node found gone, the attempt is not ended when every node of ``ranks`` has
    reported ``succeeded`` (or its ranks finished) for it (checked in this transaction, after whatever report came first): a node that
    finished its part and then vanished is no loss (see :func:`finished_ranks`).

    A notice (the attempt's, or ``notice``) makes a failure or a loss that follows it the notice's preemption, of the
    node on notice; of a gang, not once that node's part was done (its ranks never stopped for the notice): the
    attempt then ends as ``reason`` says, with ``ranks``, and the node that finished is never blamed."""
    now = now or time.time()
    with store.db.transaction() as tx:
        job = store.job(job_id, tx)
        current = store.current_attempt(job_id, tx)
        if job is None or current is None or current.attempt != attempt:
            return None
        if unless_finished and current.num_nodes > 1 and finished_ranks(store, tx, job_id, attempt, ranks):
            return None
        notice = notice or current.notice
        rows = GangStore(store).nodes_of(job_id, attempt, tx) if current.num_nodes > 1 else []
        finished = {n.rank for n in rows if reported_end(n) == EndReason.SUCCEEDED}
        noticed = notice.node_rank if notice else None
        # A notice explains what follows it, unless its node's part was done first (its ranks never stopped for it)
        explains = notice is not None and noticed not in finished
        if reason in ("failed", "lost") and explains:
            reason = "preempted"  # the node was on notice: whatever happened next is the preemption
        checkpoint = job.checkpoint or {}
        own_checkpoint = checkpoint.get("attempt") == attempt
        commit_at = checkpoint.get("time") if own_checkpoint else None
        working_since = store.restored_at(tx, job_id, attempt) or current.running_at
        recovery = job.spec.recovery
        state, why = next_state(
            reason, preemptions=job.preemptions, failures=job.failures,
            max_preemptions=recovery.max_preemptions, max_failures=recovery.max_failures,
        )
        if force_state is not None:
            state, why = force_state, message or why
        catch_up(tx, job_id, job.state, state, attempt, now)
        end = AttemptEnd(
            attempt=attempt, reason=reason, exit_code=exit_code, notice=notice,
            lost_seconds=0.0 if trained_nothing else lost_seconds(
                reason, now, working_since, commit_at, stopped_at_commit=own_checkpoint and bool(checkpoint.get("emergency"))),
            drill=drill, message=message or why,
        )
        transition(tx, job_id, state, now=now, message=why, attempt_end=end)
        if state in TERMINAL:  # a replacement prepared for a job that has ended goes too (before the job's nodes)
            release_standbys(store, tx, job_id, now)
        if current.num_nodes > 1:
            if explains and noticed is not None and reason == "preempted":
                ranks = (noticed,)  # the node on notice ended it, whoever reported first
            _end_gang(store, tx, current, reason, ranks, job_goes_on=state not in TERMINAL, finished=finished,
                      noticed=noticed)
        elif drain_until is not None:
            store.drain_node(tx, current.node_id, drain_until)
        else:
            release_nodes(store, tx, job_id, attempt)
        return state


def finished_ranks(store: Store, tx, job_id: str, attempt: int, ranks: Iterable[int]) -> bool:
    """Has the node of every one of ``ranks`` (at least one) reported ``succeeded`` for this gang attempt (or that its
    ranks finished, its launcher still running: :func:`~runner.scheduler.gang.reported_end`)?"""
    ranks = set(ranks)
    reported = {n.rank: reported_end(n) for n in GangStore(store).nodes_of(job_id, attempt, tx) if n.rank in ranks}
    return bool(ranks) and set(reported) == ranks and all(r == EndReason.SUCCEEDED for r in reported.values())


def release_standbys(store: Store, tx, job_id: str, now: float) -> None:
    """The job has ended: its prepared replacement goes, and the attempt it stood by for says so (released, and
    when: its cost runs until then)."""
    standbys = StandbyStore(store)
    for node in standbys.release_job(tx, job_id):
        standbys.update_record(tx, job_id, node.prepared_for, outcome="released", released_at=now)
        store.add_event(tx, job_id, "standby", f"replacement {node.id} released: the job has ended",
                        attempt=node.prepared_for)


def catch_up(tx, job_id: str, job_state: str, to_state: str, attempt: int, now: float) -> str:
    """Walk a job whose attempt is ahead of its state up to where ``to_state`` may follow; return its state.

    The job moves to PROVISIONING when the launch's answer is applied, but the node can register, run and
    report first (a tick late under load, a launch asked for again after a failover): its exit report then finds
    the job still PENDING or RECOVERING, from where SUCCEEDED, say, is no allowed change. The node did launch and
    run, so the job passes through PROVISIONING (and RUNNING) first, each change an event that says why."""
    if job_state in (PENDING, RECOVERING) and to_state not in ALLOWED[job_state]:
        transition(tx, job_id, PROVISIONING, now=now,
                   message=f"attempt {attempt}'s node reported before its launch's answer was recorded")
        job_state = PROVISIONING
    if job_state == PROVISIONING and to_state not in ALLOWED[PROVISIONING] and to_state in ALLOWED[RUNNING]:
        transition(tx, job_id, RUNNING, now=now, message=f"attempt {attempt} running")
        job_state = RUNNING
    return job_state


# How long a handed-over node may take to report its exit before it is reclaimed anyway (a notice's own
# deadline, where it is sooner, comes first): its process has committed and only has to exit.
DRAIN_LIMIT_SECONDS = 120.0


def hand_over(store: Store, node: Node, step: int | None, now: float | None = None) -> str | None:
    """The emergency checkpoint after a notice is durable (agents/handover.py): end the attempt as preempted
    now, so the next one launches while this node's process exits; the node drains instead of being released.

    Only for a single-node attempt on notice whose handed-over step is the job's checkpoint; returns the
    job's new state, or None when the handover does not apply (the exit report then ends the attempt)."""
    now = now or time.time()
    job = store.job(node.job_id)
    current = store.current_attempt(node.job_id)
    if (job is None or current is None or current.attempt != node.attempt or current.num_nodes > 1
            or not current.notice or (job.checkpoint or {}).get("step") != step):
        return None
    message = f"preempted: emergency checkpoint at step {step}, durable; the next attempt starts while this node drains"
    return end_attempt(store, node.job_id, node.attempt, "preempted", now=now, message=message,
                       drain_until=now + DRAIN_LIMIT_SECONDS)


def close_drained(store: Store, node: Node, exit_code: int | None) -> bool:
    """A draining node reported its process's exit: record the exit code and release the node."""
    with store.db.transaction() as tx:
        row = store.node(node.id, tx)
        if row is None or row.state != NODE_DRAINING:
            return False
        store.close_drained_attempt(tx, node.job_id, node.attempt, exit_code)
        store.update_node(tx, node.id, state=NODE_TERMINATING)
    return True


def _end_gang(store: Store, tx, attempt: Attempt, reason: str, ranks: Iterable[int], job_goes_on: bool,
              finished: set[int], noticed: int | None) -> None:
    """Each node's end in the restart log; the nodes not kept are released. ``finished``: the ranks whose part was
    done; of those, the node on notice (``noticed``) and any node found gone go with the attempt."""
    gangs = GangStore(store)
    rows = gangs.nodes_of(attempt.job_id, attempt.attempt, tx)
    going = {n.rank for n in rows if n.rank in finished and (n.rank == noticed or not _live(store, tx, n.node_id))}
    # (an elastic gang's replacements hold ranks past num_nodes; a node that left its world keeps its own end)
    reasons = node_end_reasons(max([attempt.num_nodes - 1, *(n.rank for n in rows)]) + 1, reason, ranks, job_goes_on,
                               finished, going)
    reasons = {n.rank: reasons[n.rank] for n in rows if n.left_at is None} if rows else reasons
    gangs.set_end_reasons(tx, attempt.job_id, attempt.attempt, reasons)
    for node in rows:
        row = store.node(node.node_id, tx)
        if reasons.get(node.rank) != EndReason.KEPT and row and row.state in (NODE_LAUNCHING, NODE_RUNNING):
            store.update_node(tx, node.node_id, state=NODE_TERMINATING)
    if not job_goes_on:
        release_nodes(store, tx, attempt.job_id)


def _live(store: Store, tx, node_id: str) -> bool:
    row = store.node(node_id, tx)
    return row is not None and row.state in (NODE_LAUNCHING, NODE_RUNNING)


def release_nodes(store: Store, tx, job_id: str, attempt: int | None = None) -> None:
    """Mark a job's live nodes (of one attempt, or all) for termination by the reconciler."""
    store.release_job_nodes(tx, job_id, attempt)
