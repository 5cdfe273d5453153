"""A replacement prepared while the job still trains: launched at a notice (or, with ``recovery.prepare_on``
naming it, at an AWS rebalance recommendation), it boots, registers, fetches the workdir, runs setup and
waits; the old node trains on until the replacement is ready, then checkpoints and stops, and the next
attempt starts on the waiting node from that checkpoint. Rows: runner/state/standbys.py.

- :func:`prepare` (the agent's notice or rebalance report): launch the replacement now, or keep the standby
  an earlier signal launched.
- :func:`old_node_action` (the heartbeat of a node on notice): ``checkpoint`` (stop now: the replacement is
  ready, or none is coming) or ``continue`` (train on: the replacement is still getting ready).
- :func:`take_over` (the reconciler, for a job waiting for its next attempt): the attempt starts on the
  prepared node, ready or not (a node that fails on the way is released and the job relaunches as before).
- :func:`release_unneeded` (the reconciler): a rebalance standby no notice followed within
  ``recovery.standby_timeout``, and the replacement of a notice that turned out false (the old node still
  beats well after the deadline), are released.

A gang (not elastic) prepares the replacement of its node on notice the same way, in the gang's zone, and
every node of it trains on (runner/scheduler/gang_standby.py); a rebalance recommendation to one of its nodes
launches a standby for that node's rank, on which the gang's next attempt is not started ahead (a standby may go
unused).
"""

from __future__ import annotations

import secrets
import time

import structlog

from ..spec import JobSpec
from ..state.rows import Attempt, Node
from ..state.standbys import PREPARED, StandbyStore
from ..state.store import NODE_RUNNING
from ..protocol.actions import Action
from . import gang_prestart, gang_standby, placement
from .gang import peers_exited
from .states import PROVISIONING, RECOVERING, TERMINAL
from .transitions import transition

log = structlog.get_logger(__name__)

NOTICE, REBALANCE = "notice", "rebalance"
# A node on notice still heartbeating this long after its deadline was not reclaimed: the notice was false.
FALSE_NOTICE_GRACE_SECONDS = 20.0


def prepare_on(spec: JobSpec) -> list[str]:
    return spec.recovery.prepare_on


def prepare(ctx, node: Node, signal: str, deadline: float | None = None, now: float | None = None) -> str | None:
    """Launch the replacement of ``node``'s attempt for ``signal`` (notice | rebalance); return its node id, or
    None when the job does not prepare on this signal, is a gang, or no offer fits now."""
    store, standbys, now = ctx.store, StandbyStore(ctx.store), now or time.time()
    job = store.job(node.job_id)
    current = store.current_attempt(node.job_id)
    if (job is None or job.cancel_requested or current is None or current.attempt != node.attempt
            or signal not in prepare_on(job.spec)):
        return None
    gang = job.num_nodes > 1
    if gang and not gang_standby.applies(job):
        return None  # an elastic gang trains on without the node instead (runner/scheduler/elastic.py)
    existing = standbys.live(job.id)
    if gang and existing is not None and existing.rank != node.rank:
        return None  # one replacement at a time: a second node on notice stops the gang at its own timer
    if existing is not None:
        if signal == NOTICE:
            with store.db.transaction() as tx:
                standbys.update_record(tx, job.id, current.attempt, notice_at=now, deadline=deadline)
                store.add_event(tx, job.id, "standby", f"notice: the standby {existing.id} is the replacement",
                                attempt=current.attempt)
        return existing.id
    choice, figures = (gang_standby.choose_offer(ctx, job, current, node, now), None) if gang else \
        _single_node_offer(ctx, job, current, now)
    if choice is None:
        log.info("no offer for a prepared replacement now", job=job.id, signal=signal)
        return None
    offer, spot = choice
    node_id = f"n-{secrets.token_hex(6)}"
    record = {"node": node_id, "reason": signal, "zone": offer.zone, "instance_type": offer.instance_type,
              "spot": spot, "price_per_hour": (offer.spot_price if spot else offer.on_demand_price) or 0.0,
              "launched_at": now, "ready_at": None, "deadline": deadline, "outcome": "preparing"}
    if figures:  # the cost per step that chose it, for the attempt it may start (as a launch's placement event)
        record["placement"] = figures
    if gang:
        record.update(rank=node.rank, replaces=node.id)
        # the next attempt started ahead, where safe, for a notice's replacement (a rebalance standby may go unused)
        prestart = gang_prestart.plan(ctx.providers, job, current) if signal == NOTICE else None
        if prestart is not None:
            record[gang_prestart.KEY] = prestart
    if signal == NOTICE:
        record["notice_at"] = now
    with store.db.transaction() as tx:
        fresh = store.current_attempt(job.id, tx)
        if fresh is None or fresh.attempt != current.attempt or standbys.live(job.id, tx) is not None:
            return None
        standbys.insert(tx, node_id, job.id, current.attempt, offer.cloud, ctx.token_hasher(ctx.node_token(node_id)),
                        offer, spot, now, record, rank=node.rank if gang else 0)
        what = "a preemption notice" if signal == NOTICE else "a rebalance recommendation"
        if gang:
            what += f" to node {node.id} (rank {node.rank})"
        store.add_event(tx, job.id, "standby", f"{what}: replacement {node_id} launched in {offer.zone} "
                        f"({offer.instance_type}) while the job trains on", attempt=current.attempt)
    log.info("replacement launched early", job=job.id, node=node_id, signal=signal, zone=offer.zone)
    ctx.nudge.set()  # the reconciler launches every ``launching`` node
    return node_id


def _single_node_offer(ctx, job, current, now: float):
    """The cheapest fitting offer away from the zone that got the signal (where one fits there), as the next
    launch would choose it, and the figures that chose it."""
    resources = job.spec.resources
    offers = [o for p in ctx.providers.values() for o in p.offers()]
    attempts = ctx.store.attempts(job.id)
    avoid = placement.recent_preempted_zones(attempts) | {current.zone}
    speed_of = placement.speeds(job, attempts, offers)  # where a step is cheapest, as the next launch would be
    choice, figures = None, None
    for zones in (avoid, set()):
        if choice is None:
            choice, figures = placement.choose_with_figures(offers, resources, avoid_zones=zones, backoff=ctx.backoff,
                                                            now=now, on_demand_backoff=ctx.on_demand_backoff,
                                                            speed_of=speed_of)
    return choice, figures


def old_node_action(store, node: dict, now: float | None = None) -> str:
    """The answer to the heartbeat of a node of an attempt on notice: for a gang, only its node on notice is told
    to checkpoint (its request reaches every rank through the process group); the others train on."""
    now = now or time.time()
    spec = node.get("spec")  # (the heartbeat's view has it: a single node's beat needs no further read)
    gang = spec is None or spec.resources.num_nodes > 1
    if gang and node.get("rank") is not None and (current := _gang_peer_of_the_noticed_node(store, node)):
        # Every other node reported (the one on notice, its ranks done, said succeeded): a launcher of this node's
        # waiting at its exit for theirs waits for nothing (agents/launcher_exit.py ends it once its ranks have gone)
        return Action.PEERS_EXITED if peers_exited(current.nodes, node["rank"]) else Action.CONTINUE
    standby = StandbyStore(store).live(node["job_id"])
    if standby is None or (gang and node.get("rank") is not None and standby.rank != node["rank"]):
        # nothing prepared (declined, failed, or not wanted), or a gang's standby for another rank: today's path
        return Action.CHECKPOINT_NOW
    if standby.ready_at is None:
        return Action.CONTINUE
    record = StandbyStore(store).record(None, node["job_id"], node["attempt"]) or {}
    prestart = record.get(gang_prestart.KEY)
    if prestart is not None:
        num_nodes = spec.resources.num_nodes if spec is not None else store.job(node["job_id"]).num_nodes
        if gang_prestart.holds_the_handover(prestart, num_nodes, standby.ready_at, now):
            return Action.CONTINUE  # the gang's other nodes are still starting the next attempt ahead
    deadline = record.get("deadline")
    if deadline is not None and now > deadline:
        return Action.CONTINUE  # past its deadline and still beating: reclaimed any moment, or the notice was false
    return Action.CHECKPOINT_NOW


def _gang_peer_of_the_noticed_node(store, node: dict) -> Attempt | None:
    """The running attempt, when it is a gang's on notice and ``node`` is not the node on notice."""
    current = store.current_attempt(node["job_id"])
    if (current is not None and current.num_nodes > 1 and current.notice is not None
            and current.notice.node_rank is not None and current.notice.node_rank != node["rank"]):
        return current
    return None


def mark_ready(store, node: Node, now: float | None = None) -> bool:
    now = now or time.time()
    with store.db.transaction() as tx:
        ready = StandbyStore(store).mark_ready(tx, node.id, now)
        if ready is not None:
            store.add_event(tx, node.job_id, "standby", f"replacement {node.id} is ready (setup done)",
                            attempt=ready.prepared_for)
    return ready is not None


def release_failed_standby(store, node: Node, exit_code: int | None, message: str | None) -> None:
    """The prepared node's agent could not get ready (its setup failed): release it; the job's node on notice
    is then told to stop now, and the next attempt launches as it would without one."""
    standbys, why = StandbyStore(store), message or f"exit code {exit_code}"
    with store.db.transaction() as tx:
        standbys.release(tx, node)
        standbys.update_record(tx, node.job_id, node.prepared_for, outcome="failed", failure=why,
                               released_at=time.time())
        store.add_event(tx, node.job_id, "standby", f"replacement {node.id} could not get ready ({why}); released",
                        attempt=node.prepared_for)


def launch_refused(store, tx, node: Node, error: Exception) -> None:
    """Inside the failed launch's transaction: the prepared node's launch was refused (no capacity, a quota). Its
    record says so and why; the node on notice, no longer waiting for one, is told to stop now, and the job
    relaunches as it would without one. A next attempt that had already started on it (:func:`take_over`; the
    caller deleted it with the failed launch) is taken back: the job waits for its next attempt again."""
    why = f"launch refused in {node.offer.zone} ({node.offer.instance_type}): {error}"
    standbys = StandbyStore(store)
    taken_back = {"took_over_at": None, "next_attempt": None} if node.attempt != PREPARED else {}
    standbys.update_record(tx, node.job_id, node.prepared_for, outcome="failed", failure=why,
                           released_at=time.time(), **taken_back)
    store.add_event(tx, node.job_id, "standby", f"replacement {node.id}: {why}", attempt=node.prepared_for)
    job = store.job(node.job_id, tx)
    if taken_back and job.state == PROVISIONING and job.num_nodes == 1 and store.current_attempt(job.id, tx) is None:
        transition(tx, job.id, RECOVERING, now=time.time(),
                   message=f"the replacement {node.id} the next attempt started on could not be launched")


def take_over(ctx, job) -> bool:
    """A job waiting for its next attempt (RECOVERING) with a prepared node: the attempt starts on it."""
    store, standbys = ctx.store, StandbyStore(ctx.store)
    node = standbys.live(job.id)
    if node is None or job.state != RECOVERING or job.cancel_requested:
        return False
    now = time.time()
    with store.db.transaction() as tx:
        fresh = store.job(job.id, tx)
        if fresh.state != RECOVERING or store.current_attempt(job.id, tx) is not None:
            return False
        resumed = (fresh.checkpoint or {}).get("step", 0)
        attempt = store.insert_attempt(tx, job.id, node.id, node.offer, node.spot, resumed, now)
        ready = standbys.record_take_over(tx, node, attempt, now)
        store.set_attempt_message(tx, job.id, attempt, f"started on the replacement {node.id} prepared during "
                                  f"attempt {node.prepared_for} ({ready} at the handover)")
        figures = (standbys.record(tx, job.id, node.prepared_for) or {}).get("placement")
        if figures:  # why that node: the figures a launch's placement event gives
            store.add_event(tx, job.id, placement.PLACEMENT_EVENT, figures, attempt=attempt)
        transition(tx, job.id, PROVISIONING, now=now,
                   message=f"attempt {attempt} on the prepared replacement {node.id} in {node.offer.zone}")
    log.info("next attempt on the prepared replacement", job=job.id, node=node.id, attempt=attempt)
    return True


def release_unneeded(ctx, now: float | None = None) -> None:
    """Release standbys whose job has ended, rebalance standbys past their timeout with no notice, and the
    replacements of false notices."""
    store, standbys, now = ctx.store, StandbyStore(ctx.store), now or time.time()
    for node in standbys.every_live():
        if _release_reason(store, node, now) is None:
            continue
        with store.db.transaction() as tx:
            # Decided again inside the write: a notice may have come since (the rebalance standby is now the
            # replacement it was launched for), or the standby taken over.
            decided = _release_reason(store, node, now, tx)
            if decided is None or store.node(node.id, tx).attempt != node.attempt:
                continue
            why, outcome = decided
            standbys.release(tx, node)
            standbys.update_record(tx, node.job_id, node.prepared_for, outcome=outcome, released_at=now)
            if outcome == "released: false notice":
                standbys.dismiss_notice(tx, node.job_id, node.prepared_for,
                                        f"{why}; it trains on and the replacement {node.id} was released")
            store.add_event(tx, node.job_id, "standby", f"replacement {node.id} released: {why}",
                            attempt=node.prepared_for)
        log.info("prepared replacement released", job=node.job_id, node=node.id, why=why)


def _release_reason(store, node: Node, now: float, tx=None) -> tuple[str, str] | None:
    """Why a live standby is no longer needed, and its record's outcome (None while it is)."""
    job = store.job(node.job_id, tx)
    current = store.current_attempt(node.job_id, tx)
    record = StandbyStore(store).record(tx, node.job_id, node.prepared_for) or {}
    if job is None or job.state in TERMINAL:
        return "the job has ended", "released"
    if current is None:
        return None  # the job waits for its next attempt: take_over starts it here
    if current.attempt != node.prepared_for:
        return f"attempt {node.prepared_for} it stood by for has ended", "released"
    if record.get("reason") == REBALANCE and record.get("notice_at") is None and current.notice is None:
        timeout = job.spec.recovery.standby_timeout_seconds()
        if now - node.created_at >= timeout:
            return f"no notice followed the rebalance recommendation within {timeout:g}s", "released"
        return None
    if current.notice is not None and record.get("deadline") is not None:
        old = store.node(record.get("replaces") or current.node_id, tx)  # a gang's: the node on notice
        deadline = record["deadline"]
        if (now > deadline + FALSE_NOTICE_GRACE_SECONDS and old is not None and old.state == NODE_RUNNING
                and (old.last_heartbeat or 0) > deadline + FALSE_NOTICE_GRACE_SECONDS / 2):
            return (f"false notice: node {old.id} still runs {now - deadline:.0f}s after its deadline",
                    "released: false notice")
    return None
