"""The reconciler's work for gangs (``resources.num_nodes`` > 1).

- :func:`plan_gang_attempt`: the next attempt of a waiting gang job: rows for every rank (nodes kept from
  the last attempt, new node rows for the rest), written in one transaction before any launch.
- :func:`abandon_gang_launch`: one node of a gang could not be launched: the whole attempt is taken back
  and the nodes it launched are released (all or none); the nodes kept from before stay.
- :func:`watch_gang_formation`: a gang whose nodes have not all registered within the bounded wait ends
  its attempt as ``lost``, naming the nodes that never came; the registered ones are kept.
- :func:`gang_node_gone`: the provider says a gang's node is gone: its attempt ends with that rank (unless the
  node had reported ``succeeded`` for it: its part was done).
"""

from __future__ import annotations

import secrets
import time

import structlog

from ..providers.base import free_slots as provider_free_slots
from ..providers.errors import ProviderError
from ..providers.offers import Offer
from ..spec import Resources
from ..state.gangs import GangStore
from ..state.standbys import PREPARED
from ..state.rows import AttemptNode, Job, Node
from ..state.store import NODE_RUNNING, NODE_TERMINATING
from ..protocol.events import EndReason
from ..costpolicy import observe
from ..state.spot_history import zone_preemptions
from . import placement
from . import elastic
from . import gang_prestart, gang_standby
from .attempts import end_attempt
from .gang import KeptNode, plan_gang, reported_end, unregistered_ranks
from .states import PENDING, PROVISIONING, RECOVERING, RUNNING
from .transitions import transition

log = structlog.get_logger(__name__)


def plan_gang_attempt(ctx, job: Job) -> list[str]:
    """Write the next attempt of a waiting gang job; return the ids of the nodes to launch (maybe none)."""
    store, gangs = ctx.store, GangStore(ctx.store)
    live = store.nodes(job_id=job.id)
    if any(node.state != NODE_RUNNING for node in live):
        return []  # a launch in flight, or a release to finish first (its zone slot frees when it is gone)
    # A replacement prepared during the last attempt's notice holds the rank it was prepared for (gang_standby.py)
    live, released = gang_standby.kept_or_released(store, live)
    if released:
        return []
    prepared = gang_standby.prepared_node(live)
    attempts = store.attempts(job.id)
    if prepared is not None and attempts and gang_prestart.defers_the_plan(
            attempts[-1].standby, job.num_nodes, time.time()):
        why = "the gang stopped; its next attempt, started ahead on every node, is getting ready"
        if job.message != why:
            with store.db.transaction() as tx:
                store.set_job_message(tx, job.id, why)
        return []
    resources = job.spec.resources
    num_nodes = resources.num_nodes
    kept = [KeptNode(n.rank, n.id, n.offer, n.spot) for n in live]
    offers = [o for p in ctx.providers.values() for o in p.offers()]
    avoid = placement.recent_preempted_zones(attempts)
    speed_of = placement.speeds(job, attempts, offers)
    ranked = placement.candidates(offers, resources, avoid_zones=avoid,
                                  backoff=ctx.backoff, now=time.time(), waiting_since=job.updated_at,
                                  on_demand_backoff=ctx.on_demand_backoff, on_demand_after=ctx.auto_on_demand_after,
                                  speed_of=speed_of)
    counts = gangs.live_nodes_per_zone()

    def free_slots(offer: Offer) -> int:
        return provider_free_slots(ctx.providers[offer.cloud], offer.zone, counts.get((offer.cloud, offer.zone), 0))

    reason = None
    if observe.has_deadline(job.spec):  # the deadline policy over the zones that hold the whole gang
        ranked, reason = _deadline_order(ctx, job, resources, attempts, offers, kept, avoid, speed_of, free_slots)
        if not ranked:
            if reason and reason != job.message:
                with store.db.transaction() as tx:
                    store.set_job_message(tx, job.id, reason)
            return []
    elif ranked:
        reason = placement.step_figures(ranked, ranked[0], speed_of, num_nodes)
    plan = plan_gang(num_nodes, kept, ranked, free_slots)
    if plan is None:
        with store.db.transaction() as tx:
            tx_job = store.job(job.id, tx)
            if tx_job.state in (PENDING, RECOVERING):
                store.set_job_message(tx, job.id, f"waiting for a zone with room for {num_nodes} nodes together "
                                      "(resources.num_nodes); none has it now")
        return []
    new_ids = {rank: f"n-{secrets.token_hex(6)}" for rank in plan.launch}
    now = time.time()
    with store.db.transaction() as tx:
        fresh = store.job(job.id, tx)
        still = {n.id for n in store.nodes(job_id=job.id)}
        if fresh.state != job.state or still != {n.id for n in live}:
            return []
        resumed = (fresh.checkpoint or {}).get("step", 0)
        rank0 = plan.keep.get(0)
        offer0 = rank0.offer if rank0 else plan.candidate.offer
        spot0 = rank0.spot if rank0 else plan.candidate.spot
        # The port the processes started ahead wait on, where every node has them (gang_prestart.py)
        port = gang_prestart.port_for_next(ctx.providers[offer0.cloud], store, job.id, attempts[-1] if attempts else None,
                                           {rank: k.node_id for rank, k in plan.keep.items()}, bool(plan.launch),
                                           prepared)
        attempt = store.insert_attempt(tx, job.id, rank0.node_id if rank0 else new_ids[0], offer0,
                                       spot0, resumed, now, num_nodes=num_nodes, master_port=port)
        for node_id in plan.release:
            store.update_node(tx, node_id, state=NODE_TERMINATING)
            gangs.mark_released(tx, node_id, EndReason.RELEASED)
            if prepared is not None and node_id == prepared.id:
                gang_standby.released_by_plan(store, tx, prepared, now)
        for rank, node in plan.keep.items():
            gangs.add(tx, job.id, attempt, rank, node.node_id, node.offer, node.spot)
            if store.node(node.node_id, tx).rank != rank:  # an elastic gang's replacement takes a free rank
                store.update_node(tx, node.node_id, rank=rank)
        if prepared is not None and prepared.id in {k.node_id for k in plan.keep.values()}:
            gang_standby.took_over(store, tx, prepared, attempt, now)
        for rank, node_id in new_ids.items():
            offer = plan.candidate.offer
            store.insert_node(tx, node_id, job.id, attempt, offer.cloud, ctx.token_hasher(ctx.node_token(node_id)),
                              offer, plan.candidate.spot, now, rank=rank)
            gangs.add(tx, job.id, attempt, rank, node_id, offer, plan.candidate.spot)
        what = (f"ranks {sorted(plan.keep)} kept, " if plan.keep else "") + (
            f"ranks {list(plan.launch)} launched" if plan.launch else "no node launched")
        moved = f"; the gang moves: {len(plan.release)} kept node(s) released" if plan.release else ""
        store.add_event(tx, job.id, "gang", f"attempt {attempt} in {plan.zone}: {what}{moved}", attempt=attempt, now=now)
        if reason and plan.launch:
            store.add_event(tx, job.id, placement.PLACEMENT_EVENT, reason, attempt=attempt, now=now)
        if not plan.launch:
            transition(tx, job.id, PROVISIONING, now=now,
                       message=f"attempt {attempt} on the same {num_nodes} nodes in {plan.zone}")
    log.info("gang attempt planned", job=job.id, attempt=attempt, zone=plan.zone, kept=sorted(plan.keep),
             launched=list(plan.launch), released=list(plan.release))
    return [new_ids[rank] for rank in plan.launch]


def _deadline_order(ctx, job: Job, resources: Resources, attempts, offers, kept, avoid, speed_of,
                    free_slots) -> tuple[list, str | None]:
    """A deadline gang's candidates, the cost policy's choice first, and why; ([], why) to wait.

    A zone counts only when it holds the whole gang now (the kept nodes' zone: when it holds the ranks
    missing); the nodes' prices are the gang's."""
    now = time.time()
    home = {(k.offer.cloud, k.offer.zone) for k in kept}
    missing = job.num_nodes - len(kept)

    def room(candidate) -> bool:
        offer = candidate.offer
        return free_slots(offer) >= (missing if (offer.cloud, offer.zone) in home else job.num_nodes)

    chosen, reason = placement.choose_for_deadline(
        offers, resources, job=job, attempts=attempts, avoid_zones=avoid,
        zone_history=zone_preemptions(ctx.store.db, now - observe.RATE_HISTORY_SECONDS, now),
        backoff=ctx.backoff, on_demand_backoff=ctx.on_demand_backoff, now=now, speed_of=speed_of, room=room,
        nodes=job.num_nodes)
    if chosen is None:
        return [], reason
    rest = placement.rank_offers(offers, resources, avoid_zones=avoid, backoff=ctx.backoff, now=now,
                                 on_demand_fallback=True, on_demand_backoff=ctx.on_demand_backoff)
    ordered = [chosen, *(c for c in rest if c != chosen and c.spot == chosen.spot)]  # the policy chose a market
    if any(k.spot != chosen.spot for k in kept):
        # Never a gang of both markets: it moves whole to the chosen market (its kept nodes released), in
        # another zone than theirs (their zone still counts them, so its room for the gang is not known).
        ordered = [c for c in ordered if (c.offer.cloud, c.offer.zone) not in home]
    return ordered, reason


def abandon_gang_launch(ctx, tx, node: Node, exc: ProviderError) -> None:
    """Inside the failed launch's transaction: take the whole attempt back and release what it launched."""
    store, gangs = ctx.store, GangStore(ctx.store)
    job_id, attempt = node.job_id, node.attempt
    launched = [n for n in store.nodes(job_id=job_id) if n.attempt == attempt and n.id != node.id]
    for other in launched:
        store.update_node(tx, other.id, state=NODE_TERMINATING)
    gangs.forget_attempt(tx, job_id, attempt)
    job = store.job(job_id, tx)
    why = (f"the gang of {job.num_nodes} nodes could not be completed in "
           f"{node.offer.zone} ({exc}); released the {len(launched)} other node(s) launched for it and "
           "will try again (other zones next, this one after a backoff)")
    if job.state == PROVISIONING:
        transition(tx, job_id, RECOVERING, now=time.time(), message=why)
    elif job.state in (PENDING, RECOVERING):
        store.set_job_message(tx, job_id, why)


def watch_gang_formation(ctx) -> None:
    """A gang attempt whose nodes have not all registered within ``ctx.gang_timeout`` ends as ``lost``; so does a
    one-node attempt whose node never registered (it never booted, or its agent never started): it would otherwise
    wait, billed, for ever."""
    store, gangs = ctx.store, GangStore(ctx.store)
    now = time.time()
    for current in store.unformed_attempts((PROVISIONING, RUNNING)):
        ctx.guard.run("gang formation", current.job_id, _watch_formation, ctx, gangs, current, now)


def _watch_formation(ctx, gangs: GangStore, current, now: float) -> None:
    if current.num_nodes == 1:
        if now - current.started_at > ctx.gang_timeout:
            end_attempt(ctx.store, current.job_id, current.attempt, "lost",
                        message=f"node {current.node_id} did not register within {ctx.gang_timeout:.0f}s (it never "
                                "booted, or its agent never started); replacing it")
            ctx.nudge.set()
        return
    ranks = gangs.nodes_of(current.job_id, current.attempt)
    missing = unregistered_ranks(ranks, current.started_at, now, ctx.gang_timeout)
    if not missing:
        return
    names = ", ".join(f"node {r.node_id} (rank {r.rank})" for r in ranks if r.rank in missing)
    end_attempt(ctx.store, current.job_id, current.attempt, "lost", ranks=missing,
                message=f"the gang never formed: {names} did not register within {ctx.gang_timeout:.0f}s; "
                        "replacing it")
    ctx.nudge.set()


def gang_node_gone(ctx, node: Node, reason: str, why: str) -> None:
    """A gang's node vanished: end the attempt it holds a rank in, or, between attempts, give it up (a replacement
    prepared during a notice holds no rank yet: it is only released).

    A node that had reported ``succeeded`` for the running attempt before it vanished finished its part (its ranks
    reached the job's last step during a notice, and its node was reclaimed at the deadline while a peer's ranks
    still tore down): that is no loss, and the attempt ends when the other nodes report, as it would have."""
    store, gangs = ctx.store, GangStore(ctx.store)
    if node.attempt == PREPARED and node.prepared_for is not None:
        return
    latest = gangs.latest_for_node(node.id)
    attempt = latest.attempt if latest else node.attempt
    if _finished_its_part(store, node, latest, why):
        return
    if elastic.node_leaves(store, ctx.providers, node.job_id, attempt, node.rank, reason, why):
        return  # an elastic gang trains on without it
    ended = end_attempt(store, node.job_id, attempt, reason, ranks=(node.rank,), message=why, unless_finished=True)
    if ended is None and not _finished_its_part(store, node, gangs.latest_for_node(node.id), why):
        with store.db.transaction() as tx:  # (its succeeded report may have come while the end was decided)
            gangs.mark_released(tx, node.id, reason)


def _finished_its_part(store, node: Node, latest: AttemptNode | None, why: str) -> bool:
    """Had the node reported ``succeeded`` (or that its ranks finished, its launcher still running) for the attempt
    that still runs? Then its loss ends nothing: say so."""
    current = store.current_attempt(node.job_id)
    if latest is None or current is None or latest.attempt != current.attempt:
        return False
    if reported_end(latest) != EndReason.SUCCEEDED:
        return False
    log.info("a gang node that had finished its part is gone; the attempt goes on", job=node.job_id, node=node.id,
             rank=latest.rank, attempt=latest.attempt)
    with store.db.transaction() as tx:
        store.add_event(tx, node.job_id, "gang", f"{why} after it reported succeeded: its part of attempt "
                        f"{latest.attempt} was done, so this is no loss; the attempt ends with the other nodes' "
                        "reports", attempt=latest.attempt)
    return True
