"""A gang (resources.num_nodes > 1) with spot_policy auto and a deadline is placed by the cost policy and moves
back to spot like a single node: through the reconciler, the agent API (register, heartbeat action, exit
reports) and the restart log, on the in-memory provider.

The gang's first attempt ran an hour on spot in zone-a and committed step 1,000 of 10,000 (9 h of work left)
before its rank-1 node was preempted. With a 10 h deadline its relaunch finds no spot it can afford: zone-b's
spot is backed off after a capacity error, and zone-a's observed preemption makes spot there need more than
the time left. The whole gang goes on-demand (its kept spot node released: never a gang of both markets).
Then zone-b has spot capacity again, and the gang moves there.
"""

from __future__ import annotations

import time

import pytest

from runner.protocol.actions import Action
from runner.protocol.events import EndReason
from runner.providers.memory import MemoryProvider, memory_offers
from runner.scheduler.attempts import end_attempt
from runner.scheduler.policy import BackoffBook
from runner.scheduler.spot_return import CHECK_EVERY_SECONDS, MOVE_EVENT
from runner.state.values import Notice

from api_world import api  # noqa: F401 - pytest fixtures
from scheduler_world import ADMIN, agent_api_world

ZONE_B = ("memory", "zone-b")
DEADLINE = {"resume_drill": "off", "deadline": "10h", "total_steps": 10000}


class Clock:
    def __init__(self):
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.time() + self.skipped


@pytest.fixture
def world(db_url):
    world = agent_api_world(db_url, MemoryProvider(memory_offers(("zone-a", "zone-b"))),
                       backoff=BackoffBook(base=3600, cap=3600), clock=Clock())
    return world


def nodes_of(world, job_id: str, attempt: int):
    return next(a for a in world.store.attempts(job_id) if a.attempt == attempt).nodes


def headers(world, node_id: str) -> dict:
    return {"Authorization": f"Bearer {world.ctx.node_token(node_id)}"}


def register_gang(world, api, job_id: str, attempt: int) -> None:
    """Every rank's agent registers (the rendezvous): the last one makes the attempt RUNNING."""
    for rank in nodes_of(world, job_id, attempt):
        api.post("/v1/agent/register", json={"address": f"10.0.0.{rank.rank}"}, headers=headers(world, rank.node_id))
    assert world.store.job(job_id).state == "RUNNING"


def on_demand_after_a_preemption(world, api) -> str:
    job_id = world.submit(resources={"spot_policy": "auto", "num_nodes": 2}, recovery=DEADLINE)
    world.tick()
    first = nodes_of(world, job_id, 1)
    assert {(n.zone, n.spot) for n in first} == {("zone-a", True)}  # no speed known yet: cheapest, on spot
    now = time.time()
    with world.store.db.transaction() as tx:  # it has run an hour when its ranks register (the rendezvous)
        world.store.mark_attempt_running(tx, job_id, 1, now - 3600)
    register_gang(world, api, job_id, 1)
    with world.store.db.transaction() as tx:
        world.store.record_checkpoint(tx, job_id, 1, {"step": 1000, "time": now, "durable": True})
    end_attempt(world.store, job_id, 1, "preempted", ranks=(1,),
                notice=Notice.from_json({"source": "aws", "action": "terminate", "node_rank": 1}))
    world.ctx.backoff.record_failure(ZONE_B, now)  # zone-b: no spot capacity
    world.tick(3)  # releases the preempted node and the kept spot one, then places the whole gang on on-demand
    second = nodes_of(world, job_id, 2)
    assert len(second) == 2 and {n.spot for n in second} == {False} and len({n.zone for n in second}) == 1
    assert first[0].node_id in world.provider.terminate_calls  # the kept spot node went: one market per gang
    register_gang(world, api, job_id, 2)
    placed = world.events(job_id, "placement")[-1]
    assert placed.startswith("on-demand: 9.0 h of work left, 10.0 h to the deadline"), placed
    return job_id


def test_a_deadline_gang_relaunches_on_demand_and_moves_back_to_spot_when_it_can_afford_to(world, api):
    job_id = on_demand_after_a_preemption(world, api)
    ranks = nodes_of(world, job_id, 2)
    world.ctx.clock.skipped += CHECK_EVERY_SECONDS
    world.tick()
    assert world.events(job_id, MOVE_EVENT) == []  # no spot it can afford yet
    assert api.post("/v1/agent/heartbeat", json={}, headers=headers(world, ranks[0].node_id)).json() == {
        "action": "continue"}

    world.ctx.backoff.record_success(ZONE_B, time.time())  # zone-b has spot again
    world.ctx.clock.skipped += CHECK_EVERY_SECONDS
    world.tick()
    (why,) = world.events(job_id, MOVE_EVENT)
    assert why.startswith("moved to spot: ") and "spot in zone-b saves about $" in why
    for rank in ranks:  # every node of the gang is told to stop for the move
        assert api.post("/v1/agent/heartbeat", json={}, headers=headers(world, rank.node_id)).json() == {
            "action": Action.MOVE_TO_SPOT}

    # The ranks stop together with a checkpoint of step 1,300 and report the exit.
    assert api.post("/v1/agent/events", headers=headers(world, ranks[0].node_id), json={
        "kind": "checkpoint", "data": {"step": 1300, "durable": True, "emergency": True}}).json() == {"accepted": True}
    for rank in ranks:
        reply = api.post("/v1/agent/exit", headers=headers(world, rank.node_id),
                         json={"reason": EndReason.MOVED, "exit_code": 0}).json()
        assert reply["action"] == "shutdown"  # the whole gang leaves on-demand
    world.tick(3)  # releases the on-demand nodes, then places the gang on spot

    rows = api.get(f"/v1/jobs/{job_id}/restarts", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert [(r["spot"], r["end_reason"]) for r in rows] == [(True, "preempted"), (False, "moved"), (True, "running")]
    moved, relaunched = rows[1], rows[2]
    assert why in moved["message"] and moved["checkpoint_step"] == 1300
    assert {n["end_reason"] for n in moved["nodes"]} == {"moved"}
    assert {(n["zone"], n["spot"]) for n in relaunched["nodes"]} == {("zone-b", True)}
    assert relaunched["resumed_from_step"] == 1300 and relaunched["message"].startswith("spot: ")
    assert all(rank.node_id in world.provider.terminate_calls for rank in ranks)
    job = world.store.job(job_id)
    assert (job.preemptions, job.failures) == (1, 0)  # a move is neither


def test_a_deadline_gang_counts_only_zones_that_hold_all_its_nodes(db_url):
    """zone-a is cheaper but holds 2 nodes; a gang of 3 goes to zone-b, and says why in the restart log."""
    provider = MemoryProvider(memory_offers(("zone-a", "zone-b")))
    provider.free_slots = lambda zone, live_here: (2 if zone == "zone-a" else 8) - live_here
    world = agent_api_world(db_url, provider)
    job_id = world.submit(resources={"spot_policy": "auto", "num_nodes": 3}, recovery=DEADLINE)
    world.tick()
    (attempt,) = world.store.attempts(job_id)
    assert {(n.zone, n.spot) for n in attempt.nodes} == {("zone-b", True)} and len(attempt.nodes) == 3
    assert world.events(job_id, "placement")[-1].startswith("spot: step 0 of 10000, no speed measured yet")
