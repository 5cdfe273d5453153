"""A deadline job on on-demand moves back to spot once spot is affordable: through the reconciler, the agent API
(heartbeat action, exit report) and the restart log, on the in-memory provider.

The job's first attempt ran an hour on spot in zone-a and committed step 1,000 of 10,000 (9 h of work left)
before zone-a preempted it. With a 10 h deadline its relaunch finds no spot it can afford: zone-b's spot is
backed off after a capacity error, and zone-a's observed preemption (1/h) makes spot there need more than the
time left. It runs on on-demand. Then zone-b has spot capacity again.
"""

from __future__ import annotations

import time

import pytest

from runner.protocol.actions import Action
from runner.protocol.events import EndReason
from runner.providers.memory import MemoryProvider, memory_offers
from runner.scheduler.attempts import end_attempt
from runner.scheduler.policy import BackoffBook
from runner.scheduler.spot_return import CHECK_EVERY_SECONDS, MOVE_EVENT, MOVE_GRACE_SECONDS
from runner.state.values import Notice

from api_world import api  # noqa: F401 - pytest fixtures
from scheduler_world import ADMIN, agent_api_world

ZONE_B = ("memory", "zone-b")


class Clock:
    """The scheduler's clock: the real time plus what a test skips (a rate limit, a grace)."""

    def __init__(self):
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.time() + self.skipped


@pytest.fixture
def world(db_url):
    world = agent_api_world(db_url, MemoryProvider(memory_offers(("zone-a", "zone-b"))),
                       backoff=BackoffBook(base=3600, cap=3600), clock=Clock())
    return world


def as_node(world, job_id: str) -> dict:
    node = world.node(job_id)
    return {"Authorization": f"Bearer {world.ctx.node_token(node.id)}"}


def on_demand_after_a_preemption(world) -> str:
    """The job of the module docstring, running on on-demand (attempt 2)."""
    job_id = world.submit(resources={"spot_policy": "auto"},
                          recovery={"resume_drill": "off", "deadline": "10h", "total_steps": 10000})
    world.tick()
    now = time.time()
    with world.store.db.transaction() as tx:
        world.store.mark_attempt_running(tx, job_id, 1, now - 3600)
        world.store.record_checkpoint(tx, job_id, 1, {"step": 1000, "time": now, "durable": True})
    end_attempt(world.store, job_id, 1, "preempted", notice=Notice.from_json({"source": "aws", "action": "terminate"}))
    world.ctx.backoff.record_failure(ZONE_B, now)  # zone-b: no spot capacity
    world.tick()
    world.register(job_id)
    current = world.store.current_attempt(job_id)
    assert current.attempt == 2 and not current.spot, "the relaunch should run on on-demand"
    assert world.events(job_id, "placement")[-1].startswith("on-demand: 9.0 h of work left, 10.0 h to the deadline")
    return job_id


def spot_returns(world) -> None:
    """zone-b has spot capacity again, and the worker's once-a-minute check comes round."""
    world.ctx.backoff.record_success(ZONE_B, time.time())
    world.ctx.clock.skipped += CHECK_EVERY_SECONDS


def test_an_on_demand_job_moves_to_spot_when_spot_is_affordable_again(world, api):
    job_id = on_demand_after_a_preemption(world)
    world.tick()
    assert world.events(job_id, MOVE_EVENT) == []  # no spot it can afford yet: it stays
    assert api.post("/v1/agent/heartbeat", json={}, headers=as_node(world, job_id)).json() == {"action": "continue"}

    spot_returns(world)
    world.tick()
    (why,) = world.events(job_id, MOVE_EVENT)
    assert why.startswith("moved to spot: 1.0 h of slack (9.0 h of work left, 10.0 h to the deadline), the move and "
                          "spot would need 9.0 h at the observed 0 preemptions/h")  # zone-b has none
    assert "spot in zone-b saves about $" in why
    reply = api.post("/v1/agent/heartbeat", json={}, headers=as_node(world, job_id)).json()
    assert reply == {"action": Action.MOVE_TO_SPOT}

    # The agent stops the job with a checkpoint (its step 1,300 is committed) and reports the exit.
    headers = as_node(world, job_id)
    assert api.post("/v1/agent/events", headers=headers, json={"kind": "checkpoint", "data": {
        "step": 1300, "durable": True, "emergency": True}}).json() == {"accepted": True}
    assert api.post("/v1/agent/exit", headers=headers, json={"reason": EndReason.MOVED, "exit_code": 0}).json() == {
        "state": "RECOVERING"}
    world.tick()

    rows = api.get(f"/v1/jobs/{job_id}/restarts", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert [(r["spot"], r["zone"], r["end_reason"]) for r in rows] == [
        (True, "zone-a", "preempted"), (False, rows[1]["zone"], "moved"), (True, "zone-b", "running")]
    assert why in rows[1]["message"] and rows[1]["checkpoint_step"] == 1300 and rows[1]["lost_seconds"] == 0
    assert rows[2]["resumed_from_step"] == 1300 and rows[2]["message"].startswith("spot: ")
    job = world.store.job(job_id)
    assert (job.preemptions, job.failures) == (1, 0)  # a move is neither


def test_an_agent_that_does_not_stop_the_job_has_its_attempt_ended_as_moved_after_the_grace(world, api):
    job_id = on_demand_after_a_preemption(world)
    spot_returns(world)
    world.tick()
    (why,) = world.events(job_id, MOVE_EVENT)
    on_demand_node = world.node(job_id).id

    world.ctx.clock.skipped += MOVE_GRACE_SECONDS - 1
    world.tick()
    assert world.store.current_attempt(job_id).attempt == 2  # still within the grace: left to the agent

    world.ctx.clock.skipped += 1
    world.tick()
    moved, relaunched = world.store.attempts(job_id)[1:]
    assert moved.end_reason == "moved" and moved.message.startswith(why)
    assert moved.message.endswith(f"the job had not stopped {MOVE_GRACE_SECONDS:.0f}s after the request, so "
                                     "its node was released")
    assert on_demand_node in world.provider.terminate_calls
    assert relaunched.spot and relaunched.zone == "zone-b"
    assert world.store.job(job_id).preemptions == 1


def test_no_move_is_weighed_more_often_than_once_a_minute(world):
    job_id = on_demand_after_a_preemption(world)
    world.tick()  # weighed: no affordable spot
    world.ctx.backoff.record_success(ZONE_B, time.time())
    world.tick(3)
    assert world.events(job_id, MOVE_EVENT) == []
    world.ctx.clock.skipped += CHECK_EVERY_SECONDS
    world.tick()
    assert len(world.events(job_id, MOVE_EVENT)) == 1


def test_a_job_on_spot_is_never_asked_to_move(world, api):
    job_id = world.submit(resources={"spot_policy": "auto"},
                          recovery={"resume_drill": "off", "deadline": "48h", "total_steps": 10000})
    world.tick()
    world.register(job_id)
    world.ctx.clock.skipped += CHECK_EVERY_SECONDS
    world.tick()
    assert world.store.current_attempt(job_id).spot and world.events(job_id, MOVE_EVENT) == []
    assert api.post("/v1/agent/heartbeat", json={}, headers=as_node(world, job_id)).json() == {"action": "continue"}
