"""The agent endpoints' work for gang nodes (``resources.num_nodes`` > 1); agent_api.py dispatches here.

- **Register** is the rendezvous barrier: a node joins the attempt it holds a rank in, and gets its
  assignment once every rank of the attempt has registered (with its address); until then, and between
  attempts (a node kept after a peer's preemption), the answer is ``{"status": "waiting"}`` and the agent
  asks again. The gang is RUNNING when its last node registers.
- **Exit** records each node's report; the attempt ends when the reports decide it (scheduler/gang.py).
  A node that is kept is told to stay (``{"action": "stay"}``) and registers again for the next attempt.
- **Ranks finished** (node 0 on notice, its launcher hosting the others' store): the node's part succeeded before
  its exit; recorded as such, it may end the attempt, and the exit report that follows changes nothing of it.
- **Drill**: node 0's drill report ends the attempt and opens the next one on the same nodes.
"""

from __future__ import annotations

import time

from fastapi import HTTPException

from ..providers.base import rendezvous_port
from ..providers.errors import ProviderError
from ..scheduler import elastic
from ..scheduler.attempts import end_attempt
from ..scheduler.gang import gang_outcome, gpus_per_node, reported_end
from ..scheduler.spot_return import move_request
from ..scheduler.states import PROVISIONING, RECOVERING, RUNNING, TERMINAL
from ..scheduler.transitions import AttemptEnd, transition
from ..spec import Resources
from ..ledger import boot_seconds
from ..state import ledger
from ..state.gangs import GangStore
from ..state.rows import Attempt, AttemptNode, Job, Node
from ..state.store import NODE_RUNNING, NODE_TERMINATING
from ..protocol.actions import Action, RegisterStatus
from ..protocol.events import EndReason


def waiting(message: str) -> dict:
    return {"status": RegisterStatus.WAITING, "message": message, "retry_seconds": 0.5}


def register(state, node: Node, address: str) -> tuple[int, dict | None]:
    """Join the node's attempt; return (attempt, None) once the gang is complete, else (0, a waiting reply)."""
    store, gangs = state.store, GangStore(state.store)
    now = time.time()
    # Read inside the write: a peer's report can end the attempt (and the next one be planned on the same nodes)
    # at any moment, and a registration for the attempt read before that would complete the ended attempt's
    # rendezvous and mark the job RUNNING while the next attempt's nodes have not registered.
    with store.db.transaction() as tx:
        job = store.job(node.job_id, tx)
        if job.state in TERMINAL or store.node(node.id, tx).state != NODE_RUNNING:
            raise HTTPException(409, "this node's job has ended or the node was released; shut down")
        current = store.current_attempt(job.id, tx)
        mine = gangs.latest_for_node(node.id, tx)
        if current is None or mine is None or mine.attempt != current.attempt or mine.exit_reason:
            return 0, waiting("this node is kept for the gang's next attempt, which is not planned yet")
        gangs.register(tx, job.id, current.attempt, mine.rank, address, now)
        ledger.record_registration(tx, job.id, current.attempt, mine.rank,
                                   boot_seconds(node.created_at, node.registered_at is not None, now))
        store.update_node(tx, node.id, registered_at=now, last_heartbeat=now, attempt=current.attempt)
        store.note_first_registration(tx, node.id, now)
        ranks = gangs.nodes_of(job.id, current.attempt, tx)
        # (an elastic gang's replacement joins a running attempt: it never holds up the others, nor they it)
        missing = [r.rank for r in ranks if r.registered_at is None and r.joined_at is None and r.left_at is None]
        if missing:
            return 0, waiting(f"waiting for the gang's ranks {missing} to register")
        store.mark_attempt_running(tx, job.id, current.attempt, now)
        if store.job(job.id, tx).state == PROVISIONING:
            transition(tx, job.id, RUNNING, now=now,
                       message=f"attempt {current.attempt} running: {len(ranks)} nodes in {current.zone}")
    return current.attempt, None


def gang_fields(state, job: Job, attempt: int, node: Node, address: str | None) -> dict:
    """What the job's environment says about the gang (docs/multinode.md); a single node is a gang of one."""
    store, gangs = state.store, GangStore(state.store)
    resources = job.spec.resources
    row = next(a for a in store.attempts(job.id) if a.attempt == attempt)
    joining = elastic.joiner_fields(store, node.id, job.id, attempt, address) if resources.elastic else None
    if joining is not None:  # a replacement joining a running elastic attempt: its launcher is a gang of one
        provider = state.scheduler.providers.get(row.cloud)
        return {**joining, "master_port": provider.rendezvous_port(row.master_port) if provider else 29500,
                "gpus_per_node": gpus_per_node(node_accelerators(node, resources)), "elastic": True,
                "min_nodes": resources.min_nodes, "job_num_nodes": resources.num_nodes}
    port = row.master_port
    if port is None:  # a single-node attempt: its port is chosen when its node first registers
        provider = state.scheduler.providers.get(row.cloud)
        with store.db.transaction() as tx:
            gangs.set_master_port(tx, job.id, attempt, rendezvous_port(provider))
        port = next(a for a in store.attempts(job.id) if a.attempt == attempt).master_port
    if row.num_nodes > 1:
        ranks = gangs.nodes_of(job.id, attempt)
        ips = [r.address for r in ranks]
        rank = next(r.rank for r in ranks if r.node_id == node.id)
    else:
        ips, rank = [address or "127.0.0.1"], 0
    return {"num_nodes": row.num_nodes, "node_rank": rank, "node_ips": ips, "master_addr": ips[0],
            "master_port": port, "gpus_per_node": gpus_per_node(node_accelerators(node, resources)),
            **({"elastic": True, "min_nodes": resources.min_nodes, "job_num_nodes": resources.num_nodes}
               if resources.elastic else {})}


def node_accelerators(node: Node, resources: Resources) -> tuple[str, int] | None:
    """The accelerators of the node's own offer (which of the job's alternatives it got), else the job's first."""
    if node.offer.accelerator:
        return node.offer.accelerator, int(node.offer.accelerator_count or 1)
    return resources.accelerator()


def drill_expected_step(state, job_id: str, attempt: int) -> int | None:
    """The step a gang's attempt must restore when it follows the drill attempt (None otherwise)."""
    before = [a for a in state.store.attempts(job_id) if a.attempt == attempt - 1]
    if before and before[0].end_reason == "drill" and (before[0].drill or {}).get("passed") is None:
        return before[0].drill.get("checkpoint_step")
    return None


def exit_report(state, node: Node, reason: str, exit_code: int | None, message: str | None,
                drill: dict | None) -> dict:
    """Record a gang node's exit; end the attempt when the reports decide it; say whether the node stays."""
    store, gangs = state.store, GangStore(state.store)
    job_id, attempt = node.job_id, node.attempt
    with store.db.transaction() as tx:
        gangs.record_exit(tx, job_id, attempt, node.rank, reason, exit_code)
    current = store.current_attempt(job_id)
    new_state = None
    if current is not None and current.attempt == attempt and reason == EndReason.FAILED:
        elastic.replacement_job_failed(store, state.scheduler.providers, node, exit_code, message)
    if current is not None and current.attempt == attempt and elastic.left_the_world(store, node.id, job_id, attempt):
        elastic.release_left_node(store, node.id)  # it left an elastic world that trains on without it
        state.scheduler.nudge.set()
        return {"state": None, "action": "shutdown"}
    if current is not None and current.attempt == attempt:
        if reason == "drill" and (drill or {}).get("passed") is not False:
            new_state = _restart_after_drill(state, current, drill or {}, exit_code)
        else:
            new_state = _settle(state, current, drill, message)
    if reason == "preempted":
        new_state = _release_preempted(state, node) or new_state
    state.scheduler.nudge.set()
    return {"state": new_state, "action": Action.STAY if _kept(state, node.id) else Action.SHUTDOWN}


def ranks_finished(state, node: Node, message: str | None) -> dict:
    """A gang node on notice says every training process of it has finished and exited 0 while its launcher still
    runs (node 0's hosts the store the other launchers' exit barrier waits on, so it stays until they leave or the
    node is reclaimed): its part of the running attempt succeeded. Recorded as such, the attempt ends if the reports
    now decide it, and a loss of the node from now on ends nothing (scheduler/gang_workers.py); its exit report, when
    its launcher exits, changes nothing of it. ``accepted`` is false where there is no such part to record: another
    attempt runs, the node's exit was reported first, the job is not a gang's (or an elastic one's)."""
    store, gangs = state.store, GangStore(state.store)
    job = store.job(node.job_id)
    current = store.current_attempt(node.job_id)
    if (job is None or job.num_nodes <= 1 or job.spec.resources.elastic or current is None
            or current.attempt != node.attempt or node.rank is None):
        return {"accepted": False}
    now = time.time()
    with store.db.transaction() as tx:
        if not gangs.record_ranks_finished(tx, node.job_id, current.attempt, node.rank, now):
            return {"accepted": False}
        store.add_event(tx, node.job_id, "gang", f"node {node.id} (rank {node.rank}): every training process finished "
                        f"and exited; its part of attempt {current.attempt} is done (its launcher stays for the other "
                        "nodes)" + (f": {message}" if message else ""), attempt=current.attempt)
    new_state = _settle(state, current, None, message)
    state.scheduler.nudge.set()
    return {"accepted": True, "state": new_state}


def _settle(state, current: Attempt, drill: dict | None, message: str | None) -> str | None:
    """End the attempt if its nodes' reports decide it; a failure is first checked against lost nodes."""
    store, gangs = state.store, GangStore(state.store)
    job_id, attempt = current.job_id, current.attempt
    ranks = gangs.nodes_of(job_id, attempt)
    if any(r.joined_at is not None or r.left_at is not None for r in ranks):  # an elastic world has changed
        return _settle_elastic(state, current, ranks, drill, message)
    outcome = gang_outcome({r.rank: reported_end(r) for r in ranks}, current.num_nodes)
    if outcome is None:
        return None
    if outcome.reason == "failed":
        gone = _gone_node(state, ranks)
        if gone is not None:  # a peer's process failed because a node of the gang vanished (one still in it)
            rank, why = gone
            return end_attempt(store, job_id, attempt, "preempted" if why == "preempted" else "lost", ranks=(rank,),
                               message=f"node of rank {rank} is gone ({why}); its peers stopped")
        noticed = current.notice.node_rank if current.notice else None
        if noticed is not None and not any(r.rank == noticed and reported_end(r) for r in ranks):
            return None  # a peer failed after another node's notice: that node's report (or its loss) explains it
    # (a node whose ranks finished: every rank of it exited 0, whatever its launcher's exit said later)
    codes = {r.rank: 0 if r.ranks_finished_at is not None else r.exit_code for r in ranks}
    blamed = ", ".join(f"rank {r} (exit code {codes[r]})" for r in outcome.ranks)
    text = message if outcome.reason != "failed" else (
        f"the job failed on the node of {blamed}" if blamed else message)
    if outcome.reason == "drill":
        text = f"resume drill failed: {(drill or {}).get('message')}"
    if outcome.reason == EndReason.MOVED:  # the cost policy's move to spot: its request says why
        requested = move_request(store, job_id, attempt)
        text = "; ".join(part for part in (requested.message if requested else None, message) if part)
    force = "FAILED" if outcome.reason == "drill" else None  # a drill that took no checkpoint fails the job
    return end_attempt(store, job_id, attempt, outcome.reason, ranks=outcome.ranks, drill=drill,
                       exit_code=codes.get(outcome.ranks[0]) if outcome.ranks else codes.get(0), message=text,
                       force_state=force)


def _settle_elastic(state, current: Attempt, ranks: list[AttemptNode], drill: dict | None,
                    message: str | None) -> str | None:
    """An elastic attempt whose world has changed ends when its current members' reports decide it (renumbered
    densely; the nodes that left and a replacement not yet in decide nothing)."""
    members = elastic.deciding_ranks(state.store, current, ranks)
    outcome = gang_outcome({r.rank: r.exit_reason for r in members}, len(members))
    if outcome is None:
        return None
    if outcome.reason == "failed" and (gone := _gone_node(state, [r for r in ranks if r.left_at is None])):
        rank, why = gone  # a member's process failed because another member vanished (too few left to go on)
        return end_attempt(state.store, current.job_id, current.attempt, "preempted" if why == "preempted" else "lost",
                           ranks=(rank,), message=f"node of rank {rank} is gone ({why}); its peers stopped")
    slots = tuple(members[r].node_id for r in outcome.ranks)
    ending = tuple(r.rank for r in ranks if r.node_id in slots)
    codes = {r.rank: r.exit_code for r in members}
    text = message if outcome.reason != "failed" else (
        "the job failed on the node of " + ", ".join(f"rank {r} (exit code {codes[d]})"
                                                     for d, r in zip(outcome.ranks, ending)))
    return end_attempt(state.store, current.job_id, current.attempt, outcome.reason, ranks=ending, drill=drill,
                       exit_code=codes.get(outcome.ranks[0]) if outcome.ranks else codes.get(0), message=text)


def _release_preempted(state, node: Node) -> str | None:
    """A node that had its own notice goes, even when another node's preemption ended its attempt first
    and it was kept: it is released, and an attempt planned with it ends (its rank is replaced)."""
    store, gangs = state.store, GangStore(state.store)
    new_state = None
    planned = gangs.latest_for_node(node.id)
    current = store.current_attempt(node.job_id)
    if planned and current and planned.attempt == current.attempt != node.attempt:
        new_state = end_attempt(store, node.job_id, current.attempt, "preempted", ranks=(planned.rank,),
                                message=f"node {node.id} (rank {planned.rank}) had a notice of its own")
    with store.db.transaction() as tx:
        if store.node(node.id, tx).state == NODE_RUNNING:
            store.update_node(tx, node.id, state=NODE_TERMINATING)
        gangs.mark_released(tx, node.id, "preempted")
    return new_state


def _gone_node(state, ranks: list[AttemptNode]) -> tuple[int, str] | None:
    """The first of ``ranks`` whose node the provider says is gone, and why; a node whose part of the attempt was
    done before it went (its ranks had all finished) explains no peer's failure and is passed over."""
    for rank in ranks:
        if reported_end(rank) == EndReason.SUCCEEDED:
            continue
        node = state.store.node(rank.node_id)
        provider = state.scheduler.providers.get(node.provider) if node else None
        if provider is None:
            continue
        try:
            status = provider.describe(node.id, node.provider_ref)
        except ProviderError:
            continue
        if not status.alive:
            return rank.rank, status.reason or "not-found"
    return None


def heartbeat_action(state, node: dict) -> str:
    """``stop`` for a kept node whose attempt has ended while its job has not reported an exit (the job did
    not learn of the peer's stop through its process group), else ``continue``. ``node``: the node's
    ``Store.heartbeat_views``."""
    attempt = next((a for a in state.store.attempts(node["job_id"]) if a.attempt == node["attempt"]), None)
    if attempt is None or attempt.end_reason == "running":
        return Action.CONTINUE
    mine = next((r for r in attempt.nodes if r.node_id == node["id"]), None)
    return Action.STOP_FOR_PEER if mine is not None and mine.exit_reason is None else Action.CONTINUE


def _kept(state, node_id: str) -> bool:
    node = state.store.node(node_id)
    job = state.store.job(node.job_id)
    return node.state == NODE_RUNNING and job.state not in TERMINAL


def _restart_after_drill(state, current: Attempt, drill: dict, exit_code: int | None) -> str | None:
    """End the drill attempt (every node kept) and open the next one on the same nodes, with a fresh port."""
    store, gangs = state.store, GangStore(state.store)
    job_id, attempt = current.job_id, current.attempt
    now = time.time()
    with store.db.transaction() as tx:
        step = int(drill["checkpoint_step"])
        result = {"passed": None, "checkpoint_step": step, "resumed_step": None, "seconds": None,
                  "checkpoint_seconds": round(float(drill.get("seconds") or 0), 3)}
        transition(tx, job_id, RECOVERING, now=now, message="resume drill: emergency checkpoint taken; restarting",
                   attempt_end=AttemptEnd(attempt=attempt, reason="drill", checkpoint_step=step, lost_seconds=0.0,
                                          drill=result, exit_code=exit_code))
        ranks = gangs.nodes_of(job_id, attempt, tx)
        if any(r.left_at is not None or r.joined_at is not None for r in ranks):
            # An elastic gang whose world changed: the nodes in it are kept, and the next attempt is planned as any
            # gang's (its replacements take the job's free ranks; a missing one is launched)
            gangs.set_end_reasons(tx, job_id, attempt, {r.rank: "kept" for r in ranks if r.left_at is None})
            return RECOVERING
        gangs.set_end_reasons(tx, job_id, attempt, {r.rank: "kept" for r in ranks})
        resumed = (store.job(job_id, tx).checkpoint or {}).get("step", 0)
        provider = state.scheduler.providers[current.cloud]
        rank0 = store.node(ranks[0].node_id, tx)
        nxt = store.insert_attempt(tx, job_id, rank0.id, rank0.offer, rank0.spot, resumed, now,
                                   num_nodes=current.num_nodes,
                                   master_port=rendezvous_port(provider, current.master_port))
        for rank in ranks:
            node = store.node(rank.node_id, tx)
            gangs.add(tx, job_id, nxt, rank.rank, node.id, node.offer, node.spot)
        transition(tx, job_id, PROVISIONING, now=now, message=f"resume drill: attempt {nxt} on the same nodes")
    return PROVISIONING


def record_drill(state, node: Node, result: dict) -> str | None:
    """Merge one node's drill verdict into the drill attempt's (every node checks its own ranks); a failure
    on any node fails the job."""
    store, gangs = state.store, GangStore(state.store)
    job_id = node.job_id
    # Read and merged inside the write: the gang's nodes report at nearly the same moment, and a merge of what
    # was read before another node's verdict was written would drop that verdict.
    with store.db.transaction() as tx:
        attempts = store.attempts(job_id, tx)
        drilled = [a for a in attempts if a.end_reason == "drill"]
        target = drilled[-1] if drilled else next((a for a in attempts if a.attempt == node.attempt), None)
        if target is None:
            return None
        old = target.drill or {}
        ranks = {**(old.get("ranks") or {}), **(result.get("ranks") or {})}
        if old.get("passed") is False:
            merged = {**old, "ranks": ranks}
        else:
            merged = {**old, **result, "ranks": ranks}
        merged["nodes_reported"] = old.get("nodes_reported", 0) + 1
        gangs.set_drill(tx, job_id, target.attempt, merged, result.get("message") if result.get("passed") is False
                        else None)
    if result.get("passed") is False:
        return end_attempt(store, job_id, node.attempt, "failed", ranks=(node.rank,), force_state="FAILED",
                           message=f"resume drill failed on the node of rank {node.rank}: {result.get('message')}")
    return None
