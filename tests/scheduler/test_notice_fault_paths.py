"""The fault paths of a notice trained through (runner/scheduler/standby.py), driven through the store and the
reconciler on the in-memory provider: the replacement's launch refused or its setup failed, a cancel during
the notice, and the leader's death while the replacement boots. In each, nothing is lost, no node is left
running, and the restart log says what happened."""

from __future__ import annotations

import time

import pytest
from scheduler_world import make_world
from ticking import tick_until

from runner.scheduler import standby
from runner.scheduler.attempts import end_attempt, hand_over
from runner.scheduler.cloud_calls import CloudCalls
from runner.scheduler.reconciler import CANCEL_GRACE_SECONDS
from runner.scheduler.transitions import transition
from runner.state.ledger import node_spans
from runner.state.standbys import PREPARED
from runner.state.values import Notice

NOTICE = Notice.from_json({"source": "gcp", "kind": "termination", "action": "terminate",
                            "received_at": "2026-11-23T10:00:00Z", "deadline": "2026-11-23T10:00:30Z"})
LIVE = ("launching", "running", "terminating")


@pytest.fixture
def world(db_url):
    """Launches on threads, as in the controller: a launch held by the cloud is still out while ticks go on."""
    world = make_world(db_url, launches=CloudCalls.threaded(4, "launch"))
    yield world
    world.provider.release_launches()
    world.ctx.launches.shutdown()


def _running(world) -> tuple[str, object]:
    job_id = world.submit(recovery={"resume_drill": "off", "max_preemptions": 3})
    tick_until(world, lambda: world.store.job(job_id).state == "PROVISIONING", "the first launch")
    world.register(job_id)
    return job_id, world.node(job_id)


def _on_notice(world, job_id: str, old) -> str:
    with world.store.db.transaction() as tx:
        world.store.set_attempt_notice(tx, job_id, 1, NOTICE)
    prepared_id = standby.prepare(world.ctx, old, standby.NOTICE, deadline=time.time() + 30)
    assert prepared_id is not None
    return prepared_id


def _beat(world, node) -> str:
    return standby.old_node_action(world.store, {"job_id": node.job_id, "attempt": node.attempt})


def _commit(world, job_id: str, step: int) -> None:
    with world.store.db.transaction() as tx:
        world.store.record_checkpoint(tx, job_id, 1, {"step": step, "durable": True, "emergency": True,
                                                      "attempt": 1, "time": time.time()})


def _settled(world, job_id: str) -> bool:
    """No node of the job is launching or on its way out: each is running or terminated."""
    return all(n.state in ("running", "terminated") for n in world.store.nodes(LIVE + ("terminated",), job_id=job_id))


# --- the replacement's launch is refused -----------------------------------------------------------------

def test_a_refused_replacement_launch_tells_the_old_node_to_checkpoint_and_the_restart_log_says_why(world):
    """No capacity for the replacement: the node on notice is told to stop now, the job recovers as it would with
    no replacement (the next attempt on a new node from the handed-over step), the refused node costs nothing,
    and the restart log's ``standby`` says it failed and why."""
    job_id, old = _running(world)
    world.provider.refuse(times=1)
    prepared_id = _on_notice(world, job_id, old)
    tick_until(world, lambda: world.store.node(prepared_id).state == "terminated", "the refused launch's answer")
    assert _beat(world, old) == "checkpoint"
    record = world.store.current_attempt(job_id).standby
    assert record["outcome"] == "failed" and "no capacity" in record["failure"]

    _commit(world, job_id, 57)
    assert hand_over(world.store, old, 57) == "RECOVERING"
    tick_until(world, lambda: len(world.store.attempts(job_id)) == 2 and _settled(world, job_id), "the relaunch")
    first, second = world.store.attempts(job_id)
    assert second.resumed_from_step == 57 and second.node_id not in (old.id, prepared_id)
    assert first.standby["outcome"] == "failed"
    # Billed: the old node and the new one; the refused node never ran, and costs nothing.
    billed = {n.created_at for n in world.store.nodes(LIVE + ("terminated", "draining"), job_id=job_id)
              if n.id != prepared_id}
    assert {launched for launched, _ in node_spans(world.store.db, job_id)} == billed


def test_a_replacement_refused_after_it_took_the_next_attempt_leaves_the_job_to_relaunch(world):
    """The cloud answers the replacement's launch late (a zone's capacity error comes with the operation's end)
    and the node on notice is reclaimed first: the next attempt was started on the still-launching replacement.
    The refusal must not leave the job waiting for a node that never comes: it relaunches elsewhere, from the
    checkpoint, and the restart log says the replacement failed and why."""
    job_id, old = _running(world)
    world.provider.hold_launches()
    prepared_id = _on_notice(world, job_id, old)
    tick_until(world, lambda: world.ctx.launches.in_flight(prepared_id), "the replacement's launch to be out")
    _commit(world, job_id, 40)
    world.provider.preempt(old.id)
    end_attempt(world.store, job_id, 1, "preempted", notice=NOTICE)
    tick_until(world, lambda: len(world.store.attempts(job_id)) == 2, "the next attempt")
    assert world.store.attempts(job_id)[1].node_id == prepared_id

    world.provider.refuse(times=1)
    world.provider.release_launches()
    tick_until(world, lambda: world.store.node(prepared_id).state == "terminated", "the refusal")
    tick_until(world, lambda: any(n.id != prepared_id and n.id != old.id
                                  for n in world.store.nodes(("launching", "running"), job_id=job_id)),
               "a relaunch after the refusal")
    attempts = world.store.attempts(job_id)
    assert attempts[0].standby["outcome"] == "failed" and "no capacity" in attempts[0].standby["failure"]
    assert attempts[0].standby["next_attempt"] is None  # it never ran the attempt it had been given
    assert attempts[-1].resumed_from_step == 40 and attempts[-1].node_id != prepared_id
    assert [a.attempt for a in attempts] == list(range(1, len(attempts) + 1))


def test_a_gangs_refused_replacement_leaves_the_gang_running_and_tells_its_node_on_notice_to_stop(world):
    """A gang's replacement has no room in the gang's zone after all: the refusal releases no node of the running
    gang (a gang's failed launch otherwise takes its whole attempt back); the node on notice is told to stop, and
    the restart log says why."""
    from runner.state.gangs import GangStore

    job_id = world.submit(resources={"num_nodes": 2}, recovery={"resume_drill": "off", "max_preemptions": 3})
    tick_until(world, lambda: len(world.store.nodes(("running",), job_id=job_id)) == 2, "the gang's launch")
    with world.store.db.transaction() as tx:
        for rank in (0, 1):
            GangStore(world.store).register(tx, job_id, 1, rank, f"10.0.0.{rank}", time.time())
        world.store.mark_attempt_running(tx, job_id, 1, time.time())
        transition(tx, job_id, "RUNNING", now=time.time(), message="the gang runs")
        world.store.set_attempt_notice(tx, job_id, 1, NOTICE.with_rank(1))
    node0, node1 = sorted(world.store.nodes(("running",), job_id=job_id), key=lambda n: n.rank)
    world.provider.refuse(times=1)
    prepared_id = standby.prepare(world.ctx, node1, standby.NOTICE, deadline=time.time() + 30)
    tick_until(world, lambda: world.store.node(prepared_id).state == "terminated", "the refused launch's answer")
    world.tick(2)
    assert {world.store.node(n.id).state for n in (node0, node1)} == {"running"}
    assert world.store.job(job_id).state == "RUNNING"
    beat = {n.rank: standby.old_node_action(world.store, {"job_id": job_id, "attempt": 1, "rank": n.rank})
            for n in (node0, node1)}
    assert beat == {0: "continue", 1: "checkpoint"}
    record = world.store.current_attempt(job_id).standby
    assert record["outcome"] == "failed" and "no capacity" in record["failure"]


# --- the replacement's setup fails -----------------------------------------------------------------------

def test_a_replacement_whose_setup_fails_is_released_and_billed_only_until_then(world):
    job_id, old = _running(world)
    prepared_id = _on_notice(world, job_id, old)
    tick_until(world, lambda: world.store.node(prepared_id).state == "running", "the replacement's launch")
    assert _beat(world, old) == "continue"
    standby.release_failed_standby(world.store, world.store.node(prepared_id), 3, "setup failed with exit code 3")
    assert _beat(world, old) == "checkpoint"
    tick_until(world, lambda: world.store.node(prepared_id).state == "terminated", "the failed replacement's release")
    failed = world.store.node(prepared_id)
    record = world.store.current_attempt(job_id).standby
    assert record["outcome"] == "failed" and "setup failed with exit code 3" in record["failure"]
    assert (failed.created_at, failed.terminated_at) in node_spans(world.store.db, job_id)

    _commit(world, job_id, 57)
    assert hand_over(world.store, old, 57) == "RECOVERING"
    tick_until(world, lambda: len(world.store.attempts(job_id)) == 2, "the relaunch")
    assert world.store.attempts(job_id)[1].node_id not in (old.id, prepared_id)
    assert world.store.attempts(job_id)[1].resumed_from_step == 57


# --- a cancel during the notice --------------------------------------------------------------------------

def test_a_cancel_while_the_replacement_boots_releases_both_nodes(world):
    job_id, old = _running(world)
    prepared_id = _on_notice(world, job_id, old)
    tick_until(world, lambda: world.store.node(prepared_id).state == "running", "the replacement's launch")
    world.cancel(job_id, at=time.time() - CANCEL_GRACE_SECONDS - 1)  # its agent did not stop it in time
    tick_until(world, lambda: world.store.job(job_id).state == "CANCELLED" and _settled(world, job_id), "the cancel")
    assert world.provider.alive() == []
    assert {n.state for n in world.store.nodes(LIVE + ("terminated",), job_id=job_id)} == {"terminated"}
    (only,) = world.store.attempts(job_id)
    assert only.end_reason == "cancelled" and only.standby["outcome"] == "released"


def test_a_cancel_between_the_handover_and_the_next_attempt_releases_the_waiting_replacement(world):
    """The old node handed over (the job waits for its next attempt) and the user cancels before the prepared
    node took it: no attempt starts, the replacement goes, the job is CANCELLED."""
    job_id, old = _running(world)
    prepared_id = _on_notice(world, job_id, old)
    tick_until(world, lambda: world.store.node(prepared_id).state == "running", "the replacement's launch")
    assert standby.mark_ready(world.store, world.store.node(prepared_id))
    _commit(world, job_id, 57)
    assert hand_over(world.store, old, 57) == "RECOVERING"
    world.cancel(job_id)
    tick_until(world, lambda: world.store.job(job_id).state == "CANCELLED", "the cancel")
    tick_until(world, lambda: world.store.node(prepared_id).state == "terminated", "the replacement's release")
    assert len(world.store.attempts(job_id)) == 1
    assert world.store.attempts(job_id)[0].standby["outcome"] == "released"
    assert old.id not in world.provider.alive() or world.store.node(old.id).state == "draining"


# --- the leader dies while the replacement boots ---------------------------------------------------------

def test_a_new_leader_takes_over_a_pending_handover_without_a_second_replacement(world, db_url):
    """The leader launched the replacement and died with the launch out. The next leader (its own scheduler on
    the same database and cloud) asks for that launch again (idempotent per node), answers the old node's
    heartbeats as the first would, takes the notice's report again without a second replacement, and starts
    the next attempt on the prepared node from the handed-over step."""
    job_id, old = _running(world)
    world.provider.hold_launches()
    prepared_id = _on_notice(world, job_id, old)
    tick_until(world, lambda: world.ctx.launches.in_flight(prepared_id), "the replacement's launch to be out")
    # The leader is gone: its scheduler never ticks again. The follower's shares the database and the cloud.
    follower = make_world(db_url, world.provider, launches=CloudCalls.threaded(4, "launch"))
    try:
        world.provider.release_launches()
        tick_until(follower, lambda: world.store.node(prepared_id).state == "running", "the launch, asked again")
        assert _beat(follower, old) == "continue"
        assert standby.prepare(follower.ctx, old, standby.NOTICE, deadline=time.time() + 30) == prepared_id
        assert standby.mark_ready(follower.store, follower.store.node(prepared_id))
        assert _beat(follower, old) == "checkpoint"
        _commit(follower, job_id, 57)
        assert hand_over(follower.store, old, 57) == "RECOVERING"
        tick_until(follower, lambda: len(follower.store.attempts(job_id)) == 2, "the next attempt")
        first, second = follower.store.attempts(job_id)
        assert second.node_id == prepared_id and second.resumed_from_step == 57
        assert first.standby["outcome"] == "took over"
        assert sorted(world.provider.nodes) == sorted([old.id, prepared_id])  # one replacement, one VM
        assert follower.store.node(prepared_id).attempt == 2 != PREPARED
    finally:
        follower.ctx.launches.shutdown()


# --- the durable tier refused the checkpoint held at the deadline ----------------------------------------

@pytest.mark.parametrize("tier, named", [("durable", True), ("local", False)])
def test_a_node_gone_after_its_checkpoint_failed_on_the_durable_tier_says_which_step_is_durable(world, tier, named):
    """The node on notice held at a checkpoint the durable tier refused and was then reclaimed: its attempt's
    message names the newest durable step (the one the next attempt resumes from) and the tier's error. A local
    tier's failure loses nothing durable and is not named."""
    job_id, old = _running(world)
    _commit(world, job_id, 30)
    with world.store.db.transaction() as tx:
        world.store.set_attempt_notice(tx, job_id, 1, NOTICE)
        world.store.add_event(tx, job_id, "checkpoint_failed", f"checkpoint of step 228 not saved on the {tier} tier: "
                              "OSError: unreachable", attempt=1)
    world.provider.preempt(old.id)
    tick_until(world, lambda: world.store.attempts(job_id)[0].end_reason != "running", "the reclaim")
    message = world.store.attempts(job_id)[0].message
    note = "its newest durable checkpoint: step 30 (checkpoint of step 228 not saved on the durable tier"
    assert (note in message) == named, message
