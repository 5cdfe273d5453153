"""Elastic gangs (``resources.min_nodes`` below ``num_nodes``): the survivors train on while a node is replaced.

When a node of an elastic attempt is preempted (its notice) or lost (no notice), the attempt does not end as
long as ``min_nodes`` nodes remain: a new *generation* of its world is formed from the survivors (node ranks
renumbered densely in their old order, the rendezvous on the lowest survivor at a fresh port), and each
survivor's agent hears of it on its next heartbeat (``world``) and hands it to the training processes, which
move to the smaller process group in the same processes. A replacement is launched into the same attempt
(same zone and instance type as the survivors), and once its agent has registered and run ``setup``, the next
generation includes it: its training process, started with ``RUNNER_ELASTIC_JOIN=1``, gets the state from a
survivor. With too few survivors (or ``recovery.max_preemptions`` used up) nothing here applies and the attempt
ends as for any gang (docs/multinode.md).

Pure decisions first (:func:`shrink`, :func:`grow`, :func:`world_message`), then what the hooks in the
controller and the reconciler call.
"""

from __future__ import annotations

import secrets
import time
from typing import Iterable

import structlog

from ..protocol.actions import Action
from ..state.elastic import ElasticStore, World
from ..state.gangs import GangStore
from ..state.rows import Attempt, AttemptNode, Job
from ..state.store import NODE_LAUNCHING, NODE_RUNNING, NODE_TERMINATING
from .attempts import end_attempt
from .states import RUNNING

log = structlog.get_logger(__name__)

ELASTIC_EVENT = "elastic"


# --- pure decisions ------------------------------------------------------------------------------
def is_elastic(job: Job) -> bool:
    return job.spec.resources.elastic


def current_world(ranks: Iterable[AttemptNode], worlds: list[World]) -> World:
    """The newest generation; generation 0 is every rank the attempt was planned with."""
    if worlds:
        return worlds[-1]
    return World(0, tuple(r.rank for r in ranks if r.joined_at is None), None, None)


def shrink(world: World, leaving: int, min_nodes: int) -> tuple[int, ...] | None:
    """The members left when ``leaving`` goes, or None when fewer than ``min_nodes`` would remain."""
    rest = tuple(rank for rank in world.ranks if rank != leaving)
    return rest if len(rest) >= min_nodes else None


def grow(world: World, joiners: Iterable[int]) -> tuple[int, ...]:
    """The members once ``joiners`` are in: the survivors keep their order, the newcomers follow."""
    return world.ranks + tuple(sorted(set(joiners) - set(world.ranks)))


def world_message(world: World, rank: int) -> dict:
    """What a member's agent forwards to its training processes (``RUNNER_NODE_RANK`` of the new world...).
    ``lost`` when a member vanished without a notice: the ranks cut the old groups off at once rather than wait
    out a collective with it (runner/checkpoint/world_sockets.py)."""
    message = {"generation": world.generation, "node_rank": world.ranks.index(rank), "nnodes": len(world.ranks),
               "master_addr": world.master_addr, "master_port": world.master_port}
    if formed_after_loss(world):
        message["lost"] = True
    return message


def shrink_reason(rank: int | str, reason: str) -> str:
    """The stored reason of a world formed because the member of ``rank`` left (``reason``: its end_reason)."""
    return f"rank {rank} {reason}"


def formed_after_loss(world: World) -> bool:
    """Whether ``world`` was formed because a member was lost (no notice), not preempted or joined: its reason as
    ``shrink_reason`` wrote it."""
    rank = world.reason.removeprefix("rank ").partition(" ")[0]
    return world.reason == shrink_reason(rank, "lost")


def _next_world(ranks: dict[int, AttemptNode], members: tuple[int, ...], previous: World, attempt: Attempt,
                provider, reason: str) -> World:
    port = provider.rendezvous_port(previous.master_port or attempt.master_port) if provider else 29500
    return World(previous.generation + 1, members, ranks[members[0]].address or "127.0.0.1", port, reason)


# --- a node leaves ------------------------------------------------------------------------------
def node_leaves(store, providers: dict, job_id: str, attempt: int, rank: int, reason: str, why: str,
                now: float | None = None, tx=None) -> bool:
    """A node of the running attempt is preempted or lost (or a replacement's job ``failed``): True when the
    attempt goes on without it (the new world is issued), False when the caller must end the attempt as for any
    gang. In ``tx`` where given."""
    job = store.job(job_id, tx)
    if job is None or not is_elastic(job) or reason not in ("preempted", "lost", "failed"):
        return False
    if tx is not None:
        return _leave(store, providers, job_id, attempt, rank, reason, why, now or time.time(), tx)
    with store.db.transaction() as tx:
        return _leave(store, providers, job_id, attempt, rank, reason, why, now or time.time(), tx)


def _leave(store, providers: dict, job_id: str, attempt: int, rank: int, reason: str, why: str, now: float,
           tx) -> bool:
    gangs, elastic = GangStore(store), ElasticStore(store)
    job = store.job(job_id, tx)
    current = store.current_attempt(job_id, tx)
    if current is None or current.attempt != attempt or job.state != RUNNING:
        return False
    rows = {r.rank: r for r in gangs.nodes_of(job_id, attempt, tx)}
    mine = rows.get(rank)
    if mine is None:
        return False
    if mine.left_at is not None:
        return True  # its loss is known already (its notice, then the node's end)
    world = current_world(rows.values(), elastic.worlds(job_id, attempt, tx))
    failed = reason == "failed"  # a replacement's own job: a failure of the job, not a preemption
    if failed and job.failures + 1 > job.spec.recovery.max_failures:
        return False
    if rank not in world.ranks:  # a replacement that had not joined yet: launch another
        elastic.mark_left(tx, job_id, attempt, rank, reason, now)
        if failed:
            elastic.count_failure(tx, job_id)
        store.add_event(tx, job_id, ELASTIC_EVENT, f"{why}; it had not joined the gang yet"
                        + ("; its node is released and another replacement is launched" if failed else ""),
                        attempt=attempt, now=now)
        return True
    members = shrink(world, rank, job.spec.resources.min_nodes)
    if members is None or (not failed and job.preemptions + 1 > job.spec.recovery.max_preemptions):
        return False
    new = _next_world(rows, members, world, current, providers.get(current.cloud),
                      shrink_reason(rank, reason))
    elastic.add_world(tx, job_id, attempt, new, now)
    elastic.mark_left(tx, job_id, attempt, rank, reason, now)
    if failed:
        elastic.count_failure(tx, job_id)
    else:
        elastic.count_preemption(tx, job_id)
    store.add_event(tx, job_id, ELASTIC_EVENT,
                    f"{why}; the gang trains on with {len(members)} of {job.num_nodes} nodes "
                    f"(generation {new.generation}, rendezvous {new.master_addr}:{new.master_port}); "
                    + ("its node is released and another replacement is launched" if failed
                       else "a replacement is launched"), attempt=attempt, now=now)
    log.info("elastic gang shrinks", job=job_id, attempt=attempt, rank=rank, reason=reason,
             generation=new.generation, members=list(members))
    return True


def replacement_job_failed(store, providers: dict, node, exit_code: int | None, message: str | None) -> bool:
    """A replacement's job failed while its node stays up (its training process crashed in ``restore()`` as it
    joined, or later): it leaves the world as a lost node does, so the survivors, whose collectives with it
    failed, train on in the next generation; its node is released and another replacement launched. It counts
    against ``recovery.max_failures``: with that used up (or too few nodes left) False, and the attempt ends
    failed as for any gang."""
    row = next((r for r in GangStore(store).nodes_of(node.job_id, node.attempt) if r.node_id == node.id), None)
    if row is None or row.joined_at is None or row.left_at is not None:
        return False
    code = f"exit code {exit_code}" if exit_code is not None else "no exit code"
    why = f"replacement {node.id} (rank {row.rank}): its job failed ({code})" + (f": {message}" if message else "")
    if node_leaves(store, providers, node.job_id, node.attempt, row.rank, "failed", why):
        return True
    current = store.current_attempt(node.job_id)
    worlds = ElasticStore(store).worlds(node.job_id, node.attempt)
    if current is not None and current.attempt == node.attempt and row.rank not in current_world(current.nodes,
                                                                                                 worlds).ranks:
        # Not a member yet, so its report decides nothing in the attempt's end: end it here (failures used up).
        end_attempt(store, node.job_id, node.attempt, "failed", ranks=(row.rank,), exit_code=exit_code,
                    message=f"{why}; recovery.max_failures is used up")
    return False


def left_the_world(store, node_id: str, job_id: str, attempt: int) -> AttemptNode | None:
    """The node's row in the running attempt when it has left its elastic world (else None)."""
    row = next((r for r in GangStore(store).nodes_of(job_id, attempt) if r.node_id == node_id), None)
    return row if row is not None and row.left_at is not None else None


def release_left_node(store, node_id: str) -> None:
    """A node that left its elastic world has reported its exit (or is found gone): it goes."""
    with store.db.transaction() as tx:
        node = store.node(node_id, tx)
        if node is not None and node.state in (NODE_LAUNCHING, NODE_RUNNING):
            store.update_node(tx, node_id, state=NODE_TERMINATING)


def deciding_ranks(store, current: Attempt, ranks: list[AttemptNode]) -> list[AttemptNode]:
    """The ranks whose exit reports decide an elastic attempt's end: the current world's members, renumbered
    densely (a node that left, or a replacement not yet in, decides nothing)."""
    world = current_world(ranks, ElasticStore(store).worlds(current.job_id, current.attempt))
    by_rank = {r.rank: r for r in ranks}
    return [_renumbered(by_rank[rank], dense) for dense, rank in enumerate(world.ranks) if rank in by_rank]


def _renumbered(row: AttemptNode, rank: int) -> AttemptNode:
    from dataclasses import replace

    return replace(row, rank=rank)


# --- the heartbeat --------------------------------------------------------------------------------
def heartbeat_world(store, node: dict, known_generation: int) -> tuple[str, dict | None] | None:
    """What a node of a running elastic attempt is told beyond ``continue``: ``("world", message)`` when its
    world has a newer generation than its agent knows; ``stop`` when it has left the world without a notice of its
    own (it was taken for lost); ``checkpoint`` when it is on notice and too few would remain without it (its agent
    trains on until told: agents/train_through.py); else None. A node on notice that has left the world trains
    on, untold, until it is reclaimed: its training has no new world and leaves the gang when the others do."""
    gangs, elastic = GangStore(store), ElasticStore(store)
    rows = gangs.nodes_of(node["job_id"], node["attempt"])
    mine = next((r for r in rows if r.node_id == node["id"]), None)
    if mine is None:
        return None
    if mine.left_at is not None:
        return (Action.STOP_FOR_PEER, None) if mine.end_reason == "lost" else None
    notice = store.current_attempt(node["job_id"]).notice
    if notice is not None and notice.node_rank == mine.rank:  # its notice could not shrink the world: the gang stops as any gang
        return Action.CHECKPOINT_NOW, None
    worlds = elastic.worlds(node["job_id"], node["attempt"])
    world = current_world(rows, worlds)
    if world.generation > known_generation and mine.rank in world.ranks:
        return Action.WORLD, world_message(world, mine.rank)
    return None


# --- the reconciler: replacements and their joining ----------------------------------------------
def elastic_attempts(store) -> list[tuple[Job, Attempt]]:
    """Running elastic jobs with their running attempt."""
    found = []
    for job in store.jobs_running_a_gang():
        if is_elastic(job):
            current = store.current_attempt(job.id)
            if current is not None:
                found.append((job, current))
    return found


def plan_replacements(ctx, job: Job, current: Attempt) -> list[str]:
    """Node rows for the ranks the attempt lacks (written before their launch); return their ids."""
    store, gangs, elastic = ctx.store, GangStore(ctx.store), ElasticStore(ctx.store)
    active = [r for r in current.nodes if r.left_at is None]
    missing = job.num_nodes - len(active)
    if missing <= 0 or job.cancel_requested or not active:
        return []
    home = store.node(active[0].node_id)
    offer = home.offer
    provider = ctx.providers.get(offer.cloud)
    if provider is None or (ctx.backoff if home.spot else ctx.on_demand_backoff).blocks(offer, time.time()):
        return []  # (a launch that failed backs its zone's type off; the gang trains on meanwhile)
    here = gangs.live_nodes_per_zone().get((offer.cloud, offer.zone), 0)
    if provider.free_slots(offer.zone, here) < missing:
        waiting = (f"the gang trains on with {len(active)} of {job.num_nodes} nodes; waiting for room in "
                   f"{offer.zone} for its replacement")
        if job.message != waiting:
            with store.db.transaction() as tx:
                store.set_job_message(tx, job.id, waiting)
        return []
    now, ids = time.time(), []
    with store.db.transaction() as tx:
        fresh = store.current_attempt(job.id, tx)
        if fresh is None or fresh.attempt != current.attempt or len(
                [r for r in fresh.nodes if r.left_at is None]) != len(active):
            return []
        next_rank = max(r.rank for r in fresh.nodes) + 1
        for rank in range(next_rank, next_rank + missing):
            node_id = f"n-{secrets.token_hex(6)}"
            store.insert_node(tx, node_id, job.id, current.attempt, offer.cloud,
                              ctx.token_hasher(ctx.node_token(node_id)), offer, home.spot, now, rank=rank)
            gangs.add(tx, job.id, current.attempt, rank, node_id, offer, home.spot)
            elastic.mark_joined(tx, job.id, current.attempt, rank, now)
            store.add_event(tx, job.id, ELASTIC_EVENT, f"replacement {node_id} (rank {rank}) launched in {offer.zone}",
                            attempt=current.attempt, now=now)
            ids.append(node_id)
    return ids


def admit_joiners(ctx, job: Job, current: Attempt, now: float | None = None, joining: Iterable[str] = ()) -> bool:
    """Issue the next generation with every replacement whose agent has registered and run setup, and whose
    training processes wait for their world (its heartbeat says ``joining``; ``joining`` names nodes whose beat
    saying so is being answered, not yet written): the survivors move to the new world at once and wait there for
    it, so it must not still be starting (importing torch takes a while). A replacement that has not registered
    within ``ctx.gang_timeout`` of its launch is given up (and replaced)."""
    joining = set(joining)
    store, elastic = ctx.store, ElasticStore(ctx.store)
    now = now or time.time()
    worlds = elastic.worlds(job.id, current.attempt)
    world = current_world(current.nodes, worlds)
    ready, late = [], []
    for row in current.nodes:
        if row.joined_at is None or row.left_at is not None or row.rank in world.ranks:
            continue
        node = store.node(row.node_id)
        if row.registered_at is not None and node is not None and node.setup_ended_at is not None and (
                row.node_id in joining or (node.progress or {}).get("joining")):
            ready.append(row.rank)
        elif row.registered_at is None and now - row.joined_at > ctx.gang_timeout:
            late.append(row)
    late = [row for row in late if _give_up(ctx, job, current.attempt, row, now)]
    if not ready:
        return bool(late)
    rows = {r.rank: r for r in current.nodes}
    members = grow(world, ready)
    with store.db.transaction() as tx:
        if elastic.worlds(job.id, current.attempt, tx)[-1:] != worlds[-1:]:
            return False  # another change came first: next tick
        moved = store.current_attempt(job.id, tx)
        if worlds and (moved is None or moved.world_generation < worlds[-1].generation):
            # The training has not said it moved to the newest world: a survivor may not have heard of it yet, and
            # one that skipped it would never leave the world the lost node was in (nor record the shrink).
            return bool(late)
        new = _next_world(rows, members, world, current, ctx.providers.get(current.cloud),
                          "joined: rank " + ", ".join(str(r) for r in ready))
        elastic.add_world(tx, job.id, current.attempt, new, now)
        store.add_event(tx, job.id, ELASTIC_EVENT,
                        f"{', '.join(rows[r].node_id for r in ready)} joined: the gang trains with {len(members)} of "
                        f"{job.num_nodes} nodes (generation {new.generation})", attempt=current.attempt, now=now)
    log.info("elastic gang grows", job=job.id, attempt=current.attempt, joined=ready, generation=new.generation)
    return True


def _give_up(ctx, job: Job, attempt: int, row: AttemptNode, now: float) -> bool:
    """The replacement of ``row`` was read as not registered past the gang timeout: it leaves the attempt and its node
    goes, unless its registration was written first (read again inside this write: its agent was answered with the
    assignment and it stays). A registration written after this is refused (its node is no longer running)."""
    store = ctx.store
    with store.db.transaction() as tx:
        if not ElasticStore(store).give_up_unregistered(tx, job.id, attempt, row.rank, now):
            return False
        store.update_node(tx, row.node_id, state=NODE_TERMINATING)
        store.add_event(tx, job.id, ELASTIC_EVENT, f"replacement {row.node_id} (rank {row.rank}) did not register "
                        f"within {ctx.gang_timeout:.0f}s; launching another", attempt=attempt, now=now)
    return True


def admit_at_once(ctx, job_id: str, node_id: str) -> bool:
    """A replacement's heartbeat says its training waits for its world: let it in now (its answer then carries
    the world), not at the reconciler's next pass after the beat is written. True when a generation was issued."""
    try:
        job, current = ctx.store.job(job_id), ctx.store.current_attempt(job_id)
        if job is None or current is None or not is_elastic(job) or job.state != RUNNING:
            return False
        return admit_joiners(ctx, job, current, joining=(node_id,))
    except Exception:  # the beat is answered all the same; the reconciler's next pass lets it in
        log.exception("letting an elastic gang's replacement in failed", job=job_id, node=node_id)
        return False


def joiner_fields(store, node_id: str, job_id: str, attempt: int, address: str | None) -> dict | None:
    """A replacement's gang fields, or None for a node of the attempt's first world. Its launcher runs as a gang
    of one on its own node (a launcher such as torchrun cannot join a rendezvous that the survivors' launchers
    left long ago); the world it joins comes in the ``world`` message its training processes wait for."""
    row = next((r for r in GangStore(store).nodes_of(job_id, attempt) if r.node_id == node_id), None)
    if row is None or row.joined_at is None:
        return None
    return {"num_nodes": 1, "node_rank": 0, "node_ips": [address or "127.0.0.1"],
            "master_addr": address or "127.0.0.1", "elastic_join": True}


# --- what the training side reports ----------------------------------------------------------------
def record_world_change(store, node, generation: int, step: int, world_size: int,
                        previous_world_size: int | None = None) -> bool:
    """The ranks moved to generation ``generation`` at ``step``: appended to the attempt's ``world_sizes`` once
    (every node reports it), with an event. False when the node's attempt is no longer running."""
    current = store.current_attempt(node.job_id)
    if current is None or current.attempt != node.attempt:
        return False
    first = None
    if previous_world_size is not None:
        first = {"step": current.resumed_from_step, "world_size": previous_world_size}
    with store.db.transaction() as tx:
        appended = ElasticStore(store).record_world_size(tx, node.job_id, node.attempt, generation, step, world_size,
                                                         first=first)
        if appended:
            store.add_event(tx, node.job_id, ELASTIC_EVENT, f"the training moved to a world of {world_size} ranks at "
                            f"step {step} (generation {generation})", attempt=node.attempt)
    return True


def record_first_world_size(store, tx, node, data: dict) -> None:
    """An elastic attempt's first world size, from its training's restore report (inside the report's ``tx``)."""
    size, step = data.get("world_size"), data.get("step")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1 or not isinstance(step, int):
        return
    job = store.job(node.job_id, tx)
    if job is not None and is_elastic(job):
        ElasticStore(store).start_world_sizes(tx, node.job_id, node.attempt, step, size)


def replacement_failed(store, node, why: str) -> bool:
    """A replacement's launch failed: it leaves the attempt (which goes on) and the next tick launches another.
    False for any other node (its launch failure is handled as for any gang)."""
    row = next((r for r in GangStore(store).nodes_of(node.job_id, node.attempt) if r.node_id == node.id), None)
    if row is None or row.joined_at is None:
        return False
    now = time.time()
    with store.db.transaction() as tx:
        ElasticStore(store).mark_left(tx, node.job_id, node.attempt, row.rank, "failed", now)
        store.update_node(tx, node.id, state="terminated", terminated_at=now)
        store.add_event(tx, node.job_id, ELASTIC_EVENT, f"replacement {node.id} (rank {row.rank}) could not be "
                        f"launched: {why}", attempt=node.attempt, now=now)
    return True
