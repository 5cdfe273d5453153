"""A replacement prepared while the job trains on, driven through the store and the reconciler on the
in-memory provider (runner/scheduler/standby.py): what the node on notice is told, which node the next
attempt runs on, and when a prepared node is released."""

from __future__ import annotations

import time

import pytest
from scheduler_world import make_world

from runner.scheduler import standby
from runner.scheduler.attempts import end_attempt, hand_over
from runner.state.standbys import PREPARED, StandbyStore
from runner.state.values import Notice

NOTICE = Notice.from_json({"source": "aws", "kind": "termination", "action": "terminate",
                            "received_at": "2026-11-23T10:00:00Z", "deadline": "2026-11-23T10:02:00Z"})


@pytest.fixture
def world(db_url):
    return make_world(db_url)


def _running(world, **recovery) -> tuple[str, object]:
    job_id = world.submit(recovery={"resume_drill": "off", "max_preemptions": 3, **recovery})
    world.tick()
    world.register(job_id)
    return job_id, world.node(job_id)


def _on_notice(world, job_id: str, old, deadline: float | None = None) -> str | None:
    with world.store.db.transaction() as tx:
        world.store.set_attempt_notice(tx, job_id, 1, NOTICE)
    return standby.prepare(world.ctx, old, standby.NOTICE, deadline=deadline or time.time() + 120)


def _beat(world, node) -> str:
    return standby.old_node_action(world.store, {"job_id": node.job_id, "attempt": node.attempt})


def _commit(world, job_id: str, step: int) -> None:
    with world.store.db.transaction() as tx:
        world.store.record_checkpoint(tx, job_id, 1, {"step": step, "durable": True, "emergency": True,
                                                      "attempt": 1, "time": time.time()})


def test_the_old_node_trains_on_until_the_replacement_is_ready_which_then_takes_the_next_attempt(world):
    job_id, old = _running(world)
    prepared_id = _on_notice(world, job_id, old)
    world.tick()  # the reconciler launches it like any launching node
    prepared = world.store.node(prepared_id)
    assert prepared.state == "running" and prepared.attempt == PREPARED and prepared.prepared_for == 1
    assert prepared.offer.zone != old.offer.zone  # away from the zone that got the notice
    assert _beat(world, old) == "continue"

    assert standby.mark_ready(world.store, prepared)
    assert _beat(world, old) == "checkpoint"

    _commit(world, job_id, 57)
    assert hand_over(world.store, old, 57) == "RECOVERING"
    world.tick()
    first, second = world.store.attempts(job_id)
    assert second.node_id == prepared_id and second.resumed_from_step == 57
    assert world.store.node(prepared_id).attempt == 2
    assert first.standby["outcome"] == "took over" and first.standby["ready_at"] is not None
    assert world.store.job(job_id).state == "PROVISIONING"
    assert sorted(n.id for n in world.store.nodes(("launching", "running"), job_id=job_id)) == [prepared_id]


def test_with_no_replacement_coming_the_old_node_is_told_to_checkpoint_now(world):
    job_id, old = _running(world, prepare_on=[])
    assert _on_notice(world, job_id, old) is None
    assert _beat(world, old) == "checkpoint"


def test_a_replacement_that_is_not_ready_at_the_handover_still_takes_the_attempt(world):
    """The fallback: the next attempt starts on it when it gets ready; nothing else is launched."""
    job_id, old = _running(world)
    prepared_id = _on_notice(world, job_id, old)
    _commit(world, job_id, 40)
    end_attempt(world.store, job_id, 1, "lost")  # the node vanished before the replacement was ready
    world.tick()
    assert world.store.attempts(job_id)[1].node_id == prepared_id
    assert len(world.store.nodes(("launching", "running"), job_id=job_id)) == 1


def test_a_false_notice_releases_the_replacement_and_the_attempt_trains_on(world):
    job_id, old = _running(world)
    deadline = time.time() - standby.FALSE_NOTICE_GRACE_SECONDS - 1  # the deadline is long past
    prepared_id = _on_notice(world, job_id, old, deadline=deadline)
    with world.store.db.transaction() as tx:  # the old node still heartbeats
        world.store.update_node(tx, old.id, last_heartbeat=time.time())
    world.tick()
    assert world.store.node(prepared_id).state in ("terminating", "terminated")
    attempt = world.store.current_attempt(job_id)
    assert attempt.attempt == 1 and attempt.notice is None and "false notice" in attempt.message
    assert attempt.standby["outcome"] == "released: false notice"


def test_a_rebalance_standby_waits_for_its_timeout_and_becomes_the_replacement_if_a_notice_follows(world):
    job_id, old = _running(world, prepare_on=["rebalance", "notice"], standby_timeout="1h")
    standby_id = standby.prepare(world.ctx, old, standby.REBALANCE)
    world.tick()
    assert world.store.node(standby_id).state == "running"
    assert _on_notice(world, job_id, old) == standby_id  # the notice reuses the standby
    assert world.store.current_attempt(job_id).standby["notice_at"] is not None


def test_a_rebalance_standby_is_released_after_its_timeout(world):
    job_id, old = _running(world, prepare_on=["rebalance", "notice"], standby_timeout="10s")
    standby_id = standby.prepare(world.ctx, old, standby.REBALANCE)
    world.tick()
    assert world.store.node(standby_id).state == "running"
    standby.release_unneeded(world.ctx, now=time.time() + 11)
    assert world.store.node(standby_id).state == "terminating"
    assert world.store.current_attempt(job_id).standby["outcome"] == "released"


def test_a_job_that_does_not_prepare_on_rebalance_launches_nothing(world):
    job_id, old = _running(world)
    assert standby.prepare(world.ctx, old, standby.REBALANCE) is None
    assert StandbyStore(world.store).live(job_id) is None


def test_the_prepared_node_goes_when_the_job_ends(world):
    job_id, old = _running(world)
    prepared_id = _on_notice(world, job_id, old)
    world.tick()
    end_attempt(world.store, job_id, 1, "cancelled")
    assert world.store.node(prepared_id).state == "terminating"


def test_a_job_that_ends_during_its_notice_succeeds_and_its_replacement_is_released_saying_when(world):
    """The job's last step came while its node was on notice: the attempt succeeds, no attempt follows, and the
    replacement prepared for it goes; its record says released and when (its cost runs until then)."""
    job_id, old = _running(world)
    prepared_id = _on_notice(world, job_id, old)
    world.tick()
    before = time.time()
    assert end_attempt(world.store, job_id, 1, "succeeded", exit_code=0) == "SUCCEEDED"
    world.tick(2)
    assert world.store.node(prepared_id).state in ("terminating", "terminated")
    (only,) = world.store.attempts(job_id)
    assert only.end_reason == "succeeded" and only.notice is not None
    assert only.standby["outcome"] == "released" and only.standby["released_at"] >= before
    assert any("released: the job has ended" in (e.message or "") for e in world.store.events(job_id))


def test_the_attempt_on_a_prepared_replacement_shows_its_boot_and_setup_in_the_ledger(world):
    """The replacement booted and ran setup before its attempt existed: the restart log's row still shows them."""
    job_id, old = _running(world)
    prepared_id = _on_notice(world, job_id, old)
    world.tick()
    prepared = world.store.node(prepared_id)
    launched = prepared.launched_at or prepared.created_at
    with world.store.db.transaction() as tx:
        world.store.update_node(tx, prepared_id, launched_at=launched)
        world.store.note_first_registration(tx, prepared_id, launched + 61.5)
        world.store.record_setup(tx, prepared_id, launched + 62.0, launched + 107.25)
    assert standby.mark_ready(world.store, world.store.node(prepared_id))
    _commit(world, job_id, 57)
    assert hand_over(world.store, old, 57) == "RECOVERING"
    world.tick()
    second = world.store.attempts(job_id)[1]
    assert second.node_id == prepared_id
    assert (second.boot_seconds, second.setup_seconds) == (61.5, 45.25)


# --- a gang (not elastic): the node on notice is prepared for while the whole gang trains on -----------------

def _running_gang(world, recovery: dict | None = None, **resources) -> tuple[str, list]:
    from runner.state.gangs import GangStore

    job_id = world.submit(resources={"num_nodes": 2, **resources},
                          recovery={"resume_drill": "off", "max_preemptions": 3, **(recovery or {})})
    world.tick()
    gangs, now = GangStore(world.store), time.time()
    with world.store.db.transaction() as tx:
        for rank in (0, 1):
            gangs.register(tx, job_id, 1, rank, f"10.0.0.{rank}", now)
        world.store.mark_attempt_running(tx, job_id, 1, now)
    nodes = sorted(world.store.nodes(("running",), job_id=job_id), key=lambda n: n.rank)
    return job_id, nodes


def _gang_beat(world, node) -> str:
    return standby.old_node_action(world.store, {"job_id": node.job_id, "attempt": node.attempt, "rank": node.rank})


def test_a_gang_node_on_notice_gets_a_replacement_in_the_gangs_zone_which_takes_its_rank_next(world):
    """Rank 1 gets a notice: its replacement launches at once in the gang's zone with rank 1; rank 1 is told to
    checkpoint once it is ready (its request stops every rank), rank 0 never is; the next attempt keeps node 0
    and runs rank 1 on the prepared node, launching nothing."""
    job_id, (node0, node1) = _running_gang(world)
    with world.store.db.transaction() as tx:
        world.store.set_attempt_notice(tx, job_id, 1, NOTICE.with_rank(1))
    prepared_id = standby.prepare(world.ctx, node1, standby.NOTICE, deadline=time.time() + 120)
    assert prepared_id is not None
    world.tick()
    prepared = world.store.node(prepared_id)
    assert prepared.state == "running" and prepared.rank == 1 and prepared.attempt == PREPARED
    assert prepared.offer.zone == node1.offer.zone  # a gang lives in one zone
    assert (_gang_beat(world, node0), _gang_beat(world, node1)) == ("continue", "continue")

    assert standby.mark_ready(world.store, prepared)
    assert (_gang_beat(world, node0), _gang_beat(world, node1)) == ("continue", "checkpoint")

    _commit(world, job_id, 80)
    assert end_attempt(world.store, job_id, 1, "preempted", ranks=(1,)) == "RECOVERING"
    launched = len(world.provider.nodes)
    world.tick(3)  # node 1's release is applied, then the next attempt is planned
    first, second = world.store.attempts(job_id)
    assert [(n.rank, n.node_id) for n in second.nodes] == [(0, node0.id), (1, prepared_id)]
    assert second.resumed_from_step == 80 and world.store.node(prepared_id).attempt == 2
    assert first.standby["outcome"] == "took over" and first.standby["rank"] == 1
    assert first.standby["replaces"] == node1.id and first.standby["next_attempt"] == 2
    assert len(world.provider.nodes) == launched  # nothing else was launched
    assert world.store.job(job_id).state == "PROVISIONING"


def test_a_gang_that_ends_during_a_notice_succeeds_and_its_replacement_is_released_saying_when(world):
    """Every rank of the gang exited 0 while node 1 was on notice: the attempt succeeds, every node goes, and the
    replacement's record says released and when."""
    job_id, (node0, node1) = _running_gang(world)
    with world.store.db.transaction() as tx:
        world.store.set_attempt_notice(tx, job_id, 1, NOTICE.with_rank(1))
    prepared_id = standby.prepare(world.ctx, node1, standby.NOTICE, deadline=time.time() + 120)
    world.tick()
    before = time.time()
    assert end_attempt(world.store, job_id, 1, "succeeded", exit_code=0) == "SUCCEEDED"
    world.tick(2)
    assert {world.store.node(n).state for n in (node0.id, node1.id, prepared_id)} <= {"terminating", "terminated"}
    (only,) = world.store.attempts(job_id)
    assert only.end_reason == "succeeded"
    assert only.standby["outcome"] == "released" and only.standby["released_at"] >= before


def test_a_gang_replacement_whose_rank_is_still_held_is_released(world):
    """The attempt ended otherwise (a resume drill: every node kept): the node on notice still holds its rank, so
    the prepared node goes and the next attempt runs on the same nodes."""
    job_id, (node0, node1) = _running_gang(world)
    with world.store.db.transaction() as tx:
        world.store.set_attempt_notice(tx, job_id, 1, NOTICE.with_rank(1))
    prepared_id = standby.prepare(world.ctx, node1, standby.NOTICE, deadline=time.time() + 120)
    world.tick()
    end_attempt(world.store, job_id, 1, "drill", ranks=())
    world.tick(3)
    assert world.store.node(prepared_id).state in ("terminating", "terminated")
    second = world.store.attempts(job_id)[1]
    assert [(n.rank, n.node_id) for n in second.nodes] == [(0, node0.id), (1, node1.id)]
    assert world.store.attempts(job_id)[0].standby["outcome"] == "released"


def test_an_elastic_gang_prepares_no_replacement_this_way(world):
    _, (_, node1) = _running_gang(world, min_nodes=1)
    assert standby.prepare(world.ctx, node1, standby.NOTICE, deadline=time.time() + 120) is None


def test_a_false_notice_to_a_gang_node_releases_its_replacement_and_the_gang_trains_on(world):
    job_id, (node0, node1) = _running_gang(world)
    with world.store.db.transaction() as tx:
        world.store.set_attempt_notice(tx, job_id, 1, NOTICE.with_rank(1))
    deadline = time.time() - standby.FALSE_NOTICE_GRACE_SECONDS - 1  # the deadline is long past
    prepared_id = standby.prepare(world.ctx, node1, standby.NOTICE, deadline=deadline)
    with world.store.db.transaction() as tx:  # the node on notice (not rank 0's) still heartbeats
        world.store.update_node(tx, node1.id, last_heartbeat=time.time())
        world.store.update_node(tx, node0.id, last_heartbeat=deadline)
    world.tick()
    assert world.store.node(prepared_id).state in ("terminating", "terminated")
    attempt = world.store.current_attempt(job_id)
    assert attempt.attempt == 1 and attempt.notice is None
    assert attempt.standby["outcome"] == "released: false notice"


def test_a_rebalance_to_a_gang_node_launches_a_standby_of_its_rank_that_a_notice_to_it_makes_the_replacement(world):
    """prepare_on [rebalance, notice]: rank 1's rebalance recommendation launches a standby for rank 1 in the gang's
    zone while every node trains on; a notice to rank 1 then makes it the replacement (the node on notice is told to
    checkpoint once it is ready), and it takes rank 1 in the next attempt."""
    job_id, (node0, node1) = _running_gang(world, recovery={"prepare_on": ["rebalance", "notice"],
                                                            "standby_timeout": "1h"})
    standby_id = standby.prepare(world.ctx, node1, standby.REBALANCE)
    assert standby_id is not None
    world.tick()
    prepared = world.store.node(standby_id)
    assert prepared.state == "running" and prepared.rank == 1 and prepared.offer.zone == node1.offer.zone
    assert standby.mark_ready(world.store, prepared)
    with world.store.db.transaction() as tx:
        world.store.set_attempt_notice(tx, job_id, 1, NOTICE.with_rank(1))
    assert standby.prepare(world.ctx, node1, standby.NOTICE, deadline=time.time() + 120) == standby_id
    assert (_gang_beat(world, node0), _gang_beat(world, node1)) == ("continue", "checkpoint")
    _commit(world, job_id, 80)
    end_attempt(world.store, job_id, 1, "preempted", ranks=(1,))
    world.tick(3)
    first, second = world.store.attempts(job_id)
    assert [(n.rank, n.node_id) for n in second.nodes] == [(0, node0.id), (1, standby_id)]
    assert first.standby["reason"] == "rebalance" and first.standby["outcome"] == "took over"


def test_a_gang_nodes_rebalance_standby_that_no_notice_follows_is_released_after_its_timeout(world):
    job_id, (node0, _) = _running_gang(world, recovery={"prepare_on": ["rebalance", "notice"],
                                                        "standby_timeout": "10s"})
    standby_id = standby.prepare(world.ctx, node0, standby.REBALANCE)
    world.tick()
    assert world.store.node(standby_id).rank == 0
    standby.release_unneeded(world.ctx, now=time.time() + 11)
    assert world.store.node(standby_id).state == "terminating"
    assert world.store.current_attempt(job_id).standby["outcome"] == "released"


def test_a_notice_to_another_rank_than_the_gang_standbys_does_not_wait_for_that_standby(world):
    """One standby at a time: with rank 0's rebalance standby up, a notice to rank 1 prepares nothing, and rank 1 is
    told to checkpoint at once rather than wait for a node that is not its replacement."""
    job_id, (node0, node1) = _running_gang(world, recovery={"prepare_on": ["rebalance", "notice"]})
    assert standby.prepare(world.ctx, node0, standby.REBALANCE) is not None
    world.tick()
    with world.store.db.transaction() as tx:
        world.store.set_attempt_notice(tx, job_id, 1, NOTICE.with_rank(1))
    assert standby.prepare(world.ctx, node1, standby.NOTICE, deadline=time.time() + 120) is None
    assert _gang_beat(world, node1) == "checkpoint"
