"""Moving a deadline job from on-demand back to spot once the cost policy can afford it (docs/cost-policy.md).

A reconciler worker, load -> decide -> apply: a RUNNING job (a single node or a gang) with ``spot_policy: auto`` and a
deadline whose attempt runs on on-demand is weighed at most once a CHECK_EVERY_SECONDS by the cost policy's
:func:`~runner.costpolicy.decide.return_to_spot`. A move is a MOVE_EVENT on the attempt (its message says
why); the node's next heartbeat answers ``Action.MOVE_TO_SPOT``, its agent stops the job with a checkpoint as
for a cancel and reports ``EndReason.MOVED``, and :func:`finish_move` ends the attempt as ``moved``: neither a
preemption nor a failure. The job RECOVERS and its relaunch goes through the deadline placement, which picks
spot. An agent that has not reported the stop MOVE_GRACE_SECONDS after the request (one too old to know the
action, or one the controller cannot hear) has its attempt ended here all the same, and its node released.
"""

from __future__ import annotations

from collections import Counter

import structlog

from ..costpolicy import Decision, observe, return_to_spot
from ..providers.base import free_slots
from ..providers.offers import Offer
from ..state.gangs import GangStore
from ..state.store import NODE_RUNNING
from ..state import Store
from ..state.rows import Attempt, Event, Job, Node
from ..state.spot_history import zone_preemptions
from ..state.spot_moves import on_demand_attempts
from ..protocol.events import EndReason
from . import placement
from .attempts import end_attempt
from .states import RUNNING

log = structlog.get_logger(__name__)

MOVE_EVENT = "move"  # an attempt's event: the cost policy asked it to stop for a move to spot; message: why
CHECK_EVERY_SECONDS = 60.0  # a job on on-demand is weighed for a move at most this often
# As for a cancel (reconciler.CANCEL_GRACE_SECONDS): the heartbeat that carries the request, the agent's
# stop_grace_seconds for the checkpoint and the exit, and the log flush. The move's stop is counted at this
# bound against the job's slack.
MOVE_GRACE_SECONDS = 20.0


def move_to_spot(ctx) -> None:
    """The worker: request a move for each job the policy says can afford one; end moves not done in time.

    Reads the running on-demand attempts without decoding a job; a job is decoded only when it is due to
    be weighed (once a CHECK_EVERY_SECONDS) or its move's grace has run out."""
    store = ctx.store
    now = ctx.clock()
    rows = on_demand_attempts(store.db, RUNNING, MOVE_EVENT)
    for gone in set(ctx.spot_checked_at) - {row.job_id for row in rows}:
        del ctx.spot_checked_at[gone]  # off on-demand, ended or cancelled: weighed afresh if it comes back
    for row in rows:
        ctx.guard.run("move to spot", row.job_id, _weigh_or_finish_move, ctx, row, now)


def _weigh_or_finish_move(ctx, row, now: float) -> None:
    """One on-demand attempt: end its move if the grace ran out, or weigh it for a move when due."""
    store = ctx.store
    job_id, attempt = row.job_id, row.attempt
    if row.move_requested_at is not None:
        if now - row.move_requested_at >= MOVE_GRACE_SECONDS:
            requested = move_request(store, job_id, attempt)
            end_attempt(store, job_id, attempt, EndReason.MOVED, now=now,
                        message=f"{requested.message}; the job had not stopped {MOVE_GRACE_SECONDS:.0f}s "
                                "after the request, so its node was released")
            ctx.nudge.set()
        return
    if now - ctx.spot_checked_at.get(job_id, float("-inf")) < CHECK_EVERY_SECONDS:
        return
    ctx.spot_checked_at[job_id] = now
    job = store.job(job_id)
    if not observe.has_deadline(job.spec):
        return  # only the deadline policy moves a job (a single node or a gang)
    current = store.current_attempt(job_id)
    if current is None or current.attempt != attempt:
        return
    decision = weigh_move(ctx, job, current, now)
    if decision.market is None:
        log.debug("staying on on-demand", job=job_id, why=decision.reason)
        return
    with store.db.transaction() as tx:
        fresh = store.job(job_id, tx)
        still = store.current_attempt(job_id, tx)
        if fresh.state != RUNNING or fresh.cancel_requested or still is None or still.attempt != attempt:
            return
        store.add_event(tx, job_id, MOVE_EVENT, decision.reason, attempt=attempt, now=now)
    log.info("moving to spot", job=job_id, attempt=attempt, why=decision.reason)


def weigh_move(ctx, job: Job, current: Attempt, now: float) -> Decision:
    """The cost policy's answer for a job running on on-demand: a spot market to move to now, or None.

    Markets are compared by the job's expected price per step; a gang's only in zones that hold all its nodes
    (its own nodes, released by the move, counted as room), at the gang's price."""
    store = ctx.store
    attempts = store.attempts(job.id)
    offers = [o for p in ctx.providers.values() for o in p.offers()]
    speed_of = placement.speeds(job, attempts, offers)
    overall = observe.steps_per_second(job, attempts)
    here = next((o for o in offers if (o.cloud, o.zone, o.instance_type) ==
                 (current.cloud, current.zone, current.instance_type)), None)
    here_speed = speed_of(here).steps_per_second if here is not None and speed_of(here) else overall
    if here_speed is None:
        return Decision(None, "staying on on-demand: no speed measured yet")

    def speed(offer: Offer) -> float:
        known = speed_of(offer)
        return known.steps_per_second if known is not None else (overall or here_speed)

    room = None
    if job.num_nodes > 1:
        counts = GangStore(store).live_nodes_per_zone()
        mine = Counter((n.provider, n.offer.zone) for n in store.nodes((NODE_RUNNING,), job_id=job.id))

        def room(candidate) -> bool:
            offer, key = candidate.offer, (candidate.offer.cloud, candidate.offer.zone)
            free = free_slots(ctx.providers[offer.cloud], offer.zone, counts.get(key, 0) - mine.get(key, 0))
            return free >= job.num_nodes

    markets = placement.spot_markets_now(
        offers, job.spec.resources,
        zone_history=zone_preemptions(store.db, now - observe.RATE_HISTORY_SECONDS, now),
        avoid_zones=placement.recent_preempted_zones(attempts, now), backoff=ctx.backoff, now=now,
        speed=speed, room=room, nodes=job.num_nodes)
    steps_left = max(0, job.spec.recovery.total_steps - job.step)
    moves = [a.ended_at for a in attempts if a.end_reason == EndReason.MOVED and a.ended_at]
    price_here = sum(n.price_per_hour for n in current.nodes) if current.nodes else current.price_per_hour
    return return_to_spot(now=now, deadline=observe.job_deadline(job), work_left=steps_left,
                          restart=observe.restart_seconds(attempts), markets=markets,
                          on_demand_price=price_here, on_demand_speed=here_speed, stop=MOVE_GRACE_SECONDS,
                          margin=placement.DEADLINE_MARGIN * steps_left / here_speed,
                          last_move=max(moves, default=None))


def move_requested(store: Store, job: Job, attempt: Attempt | None) -> bool:
    """Whether the heartbeat of this attempt's node answers MOVE_TO_SPOT (cheap checks before the query)."""
    return (attempt is not None and not attempt.spot and observe.has_deadline(job.spec)
            and move_request(store, job.id, attempt.attempt) is not None)


def move_request(store: Store, job_id: str, attempt: int) -> Event | None:
    """The move asked of this attempt (its MOVE_EVENT), or None."""
    event = store.last_event(job_id, MOVE_EVENT)
    return event if event is not None and event.attempt == attempt else None


def finish_move(store: Store, node: Node, exit_code: int | None, message: str | None = None) -> str | None:
    """The agent stopped the job for a move: end the attempt as moved, saying why; return the job's new state."""
    requested = move_request(store, node.job_id, node.attempt)
    why = requested.message if requested else "moved: the agent stopped the job for a move to spot"
    return end_attempt(store, node.job_id, node.attempt, EndReason.MOVED, exit_code=exit_code,
                       message="; ".join(part for part in (why, message) if part))
