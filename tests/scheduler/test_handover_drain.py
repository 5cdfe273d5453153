"""The handover after a notice, driven through the store and the reconciler on the in-memory provider."""

from __future__ import annotations

import time

import pytest
from scheduler_world import make_world

from runner.scheduler.attempts import close_drained, hand_over
from runner.state.values import Notice

NOTICE = Notice.from_json({"source": "aws", "kind": "termination", "action": "terminate",
                            "received_at": "2026-11-23T10:00:00Z", "deadline": "2026-11-23T10:02:00Z"})


@pytest.fixture
def world(db_url):
    return make_world(db_url)


def _running_on_notice(world, step: int = 57, notice: Notice | None = NOTICE) -> tuple[str, dict]:
    """A running job whose node is on notice and has committed the emergency checkpoint of ``step``."""
    job_id = world.submit(recovery={"resume_drill": "off", "max_preemptions": 3})
    world.tick()
    world.register(job_id)
    node = world.node(job_id)
    with world.store.db.transaction() as tx:
        if notice:
            world.store.set_attempt_notice(tx, job_id, 1, notice)
        world.store.record_checkpoint(tx, job_id, 1, {"step": step, "durable": True, "emergency": True,
                                                      "attempt": 1, "time": time.time()})
    return job_id, node


def test_the_next_node_launches_while_the_handed_over_one_drains(world):
    job_id, old = _running_on_notice(world)
    assert hand_over(world.store, old, 57) == "RECOVERING"
    assert world.store.node(old.id).state == "draining"
    first = world.store.attempts(job_id)[0]
    assert first.end_reason == "preempted" and first.checkpoint_step == 57 and first.exit_code is None

    world.tick()
    new = world.node(job_id)
    assert new.id != old.id and new.attempt == 2
    assert sorted(world.provider.alive()) == sorted([old.id, new.id])  # both run for a moment
    assert world.store.attempts(job_id)[1].resumed_from_step == 57

    assert close_drained(world.store, world.store.node(old.id), exit_code=0)
    world.tick()
    assert world.store.node(old.id).state == "terminated"
    assert world.provider.alive() == [new.id]
    assert world.store.attempts(job_id)[0].exit_code == 0


@pytest.mark.parametrize("step, notice", [(56, NOTICE), (57, None)])
def test_no_handover_for_another_step_or_without_a_notice(world, step, notice):
    """The attempt then ends at the exit report, as before: nothing launches early."""
    job_id, old = _running_on_notice(world, notice=notice)
    assert hand_over(world.store, old, step) is None
    world.tick()
    assert world.node(job_id).id == old.id and world.store.node(old.id).state == "running"
    assert not close_drained(world.store, old, exit_code=0)


def test_a_draining_node_that_never_reports_is_reclaimed_at_its_limit(world):
    job_id, old = _running_on_notice(world)
    hand_over(world.store, old, 57, now=time.time() - 3600)  # its drain limit passed long ago
    world.tick(2)
    assert world.store.node(old.id).state == "terminated"
    assert old.id not in world.provider.alive()
