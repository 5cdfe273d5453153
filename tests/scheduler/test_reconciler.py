"""The reconciler's decisions, tick by tick, against the in-memory provider and a real SQLite file.

What the end-to-end tests prove with real nodes (a process that is killed, a cloud API that refuses),
these pin down as logic: where a job goes, what a refusal or a loss does to it, and when a node is let go.
"""

from __future__ import annotations

import time

import pytest

from runner import wire
from runner.providers.errors import AuthError
from runner.providers.memory import MemoryProvider
from runner.scheduler.attempts import end_attempt
from runner.scheduler.reconciler import CANCEL_GRACE_SECONDS, Reconciler, SchedulerContext

from scheduler_world import make_world


@pytest.fixture
def world(db_url):
    return make_world(db_url)


def test_a_pending_job_launches_one_node_on_the_cheapest_spot_offer(world):
    """One tick: one node in the cheapest zone at its spot price, attempt 1, the job PROVISIONING."""
    job_id = world.submit()
    world.tick()
    (attempt,) = world.store.attempts(job_id)
    assert attempt.zone == "mem-a" and attempt.spot and attempt.price_per_hour == 0.01
    assert world.provider.alive() == [world.node(job_id).id]
    assert world.store.job(job_id).state == "PROVISIONING"
    world.tick(3)
    assert len(world.provider.nodes) == 1  # no second launch while the first node lives


def test_an_on_demand_job_launches_at_the_on_demand_price(world):
    """spot_policy on-demand: a non-spot node whose attempt is priced at the on-demand rate."""
    job_id = world.submit(resources={"spot_policy": "on-demand"})
    world.tick()
    (attempt,) = world.store.attempts(job_id)
    assert attempt.spot is False and attempt.price_per_hour == 0.05
    assert world.provider.nodes[world.node(job_id).id].request.spot is False


def test_capacity_errors_fail_over_zone_by_zone_and_are_logged(world):
    """Two stocked-out zones: each refusal is an event of the attempt that launched, in the third zone."""
    world.provider.refuse("mem-a")
    world.provider.refuse("mem-b")
    job_id = world.submit()
    world.tick(3)
    (attempt,) = world.store.attempts(job_id)
    assert attempt.zone == "mem-c" and world.store.job(job_id).state == "PROVISIONING"
    failures = world.events(job_id, "launch-failed")
    assert len(failures) == 2 and "mem-a" in failures[0] and "mem-b" in failures[1]
    assert all("no capacity" in f for f in failures)


def test_with_every_zone_out_of_capacity_the_job_waits_pending_and_says_why(world):
    """Refused everywhere: no attempt, no node, the job PENDING with the last refusal as its message."""
    world.provider.refuse(times=100)
    job_id = world.submit()
    world.tick(5)
    job = world.store.job(job_id)
    assert job.state == "PENDING" and world.store.attempts(job_id) == []
    assert "no capacity" in job.message and world.provider.alive() == []
    assert len(world.events(job_id, "launch-failed")) == 3  # each zone once, then all are backed off


def test_a_long_queue_costs_a_tick_the_same_reads_as_a_short_one(world):
    """Jobs waiting for capacity are looked at every tick: their nodes and attempts are read once for the whole
    queue, not once a job (on Postgres two round trips a job made a queue of 10,000 hold every tick up for
    seconds: node watch, cancels, launches and releases wait for it)."""
    world.provider.refuse(times=10**6)

    def reads_a_tick(jobs: int) -> int:
        for _ in range(jobs):
            world.submit()
        world.tick(3)  # every zone refused once, then backed off: the jobs wait
        reads = []
        query = world.store.db.query
        world.store.db.query = lambda *args: reads.append(args) or query(*args)
        try:
            world.tick()
        finally:
            world.store.db.query = query
        return len(reads)

    short = reads_a_tick(2)
    assert reads_a_tick(40) == short  # 42 jobs waiting now
    assert all(job.state == "PENDING" for job in world.store.jobs())


def test_bad_credentials_fail_the_job_at_once_with_the_providers_message(world):
    """A non-retryable refusal (credentials, permissions) fails the job after one try, naming the fix."""
    world.provider.refuse(error=AuthError("the role may not launch instances; grant it ec2:RunInstances"))
    job_id = world.submit()
    world.tick(3)
    job = world.store.job(job_id)
    assert job.state == "FAILED" and "ec2:RunInstances" in job.message
    assert world.provider.launch_calls == [world.node(job_id).id]


@pytest.mark.parametrize("gone, reason", [("preempt", "preempted"), ("lose", "lost")])
def test_a_node_the_cloud_takes_away_ends_the_attempt_and_the_job_moves_zone(world, gone, reason):
    """A reclaimed node ends its attempt as preempted, a vanished one as lost; both count as a preemption
    and the next attempt avoids the zone."""
    job_id = world.submit()
    world.tick()
    world.register(job_id)
    first = world.node(job_id).id
    getattr(world.provider, gone)(first)
    world.tick(2)
    ended, current = world.store.attempts(job_id)
    assert ended.end_reason == reason and first in ended.message
    assert current.end_reason == "running" and current.zone != ended.zone
    assert world.store.job(job_id).preemptions == 1 and world.store.node(first).state == "terminated"


def test_with_max_preemptions_used_up_a_lost_node_fails_the_job(world):
    """recovery.max_preemptions 0: the first loss fails the job and nothing is launched again."""
    job_id = world.submit(recovery={"resume_drill": "off", "max_preemptions": 0})
    world.tick()
    world.provider.lose(world.node(job_id).id)
    world.tick(3)
    job = world.store.job(job_id)
    assert job.state == "FAILED" and "max_preemptions" in job.message
    assert len(world.provider.nodes) == 1


def test_the_node_of_a_finished_job_is_released(world):
    """The agent's exit report ends the attempt; the next tick terminates the node through the provider."""
    job_id = world.submit()
    world.tick()
    world.register(job_id)
    node = world.node(job_id).id
    assert end_attempt(world.store, job_id, 1, "succeeded", exit_code=0) == "SUCCEEDED"
    world.tick()
    assert world.provider.terminate_calls == [node] and world.provider.alive() == []
    assert world.store.node(node).state == "terminated"


def test_a_cancelled_job_keeps_its_node_through_the_grace(world):
    """Within CANCEL_GRACE_SECONDS the agent stops the job itself: the node and the attempt stay."""
    job_id = world.submit()
    world.tick()
    world.register(job_id)
    world.cancel(job_id)
    world.tick(3)
    assert world.store.job(job_id).state == "RUNNING"
    assert world.provider.alive() == [world.node(job_id).id]


def test_after_the_cancel_grace_the_node_goes_even_if_the_agent_never_reported(world):
    """A cancel older than the grace ends the attempt as cancelled and terminates the node."""
    job_id = world.submit()
    world.tick()
    world.register(job_id)
    world.cancel(job_id, at=time.time() - CANCEL_GRACE_SECONDS - 1)
    world.tick()
    assert world.store.job(job_id).state == "CANCELLED"
    assert world.store.attempts(job_id)[0].end_reason == "cancelled"
    assert world.provider.alive() == []


def test_a_job_cancelled_before_its_node_registered_ends_at_once(world):
    """No agent to hear the cancel: the job is CANCELLED on the next tick and its node released."""
    job_id = world.submit()
    world.tick()
    world.cancel(job_id)
    world.tick()
    assert world.store.job(job_id).state == "CANCELLED" and world.provider.alive() == []


def test_a_job_cancelled_while_pending_never_launches(world):
    """Cancelled before any launch: CANCELLED, no node ever asked for."""
    world.provider.refuse(times=100)
    job_id = world.submit()
    world.cancel(job_id)
    world.tick(2)
    assert world.store.job(job_id).state == "CANCELLED" and world.provider.launch_calls == []


class CrashAfterLaunch(MemoryProvider):
    """The cloud starts the node, then the controller dies before it records the answer."""

    def launch(self, request):
        super().launch(request)
        raise SystemExit("controller killed mid-launch")


def test_a_launch_cut_short_by_a_controller_crash_is_finished_without_a_second_node(db_url):
    """The node row written before the launch lets the restarted controller finish it idempotently."""
    crashing = make_world(db_url, CrashAfterLaunch())
    job_id = crashing.submit()
    with pytest.raises(SystemExit):
        crashing.tick()
    assert crashing.node(job_id).state == "launching"
    survivor = MemoryProvider()
    survivor.nodes = crashing.provider.nodes  # the same cloud, seen by the restarted controller
    ctx = SchedulerContext(store=crashing.store, providers={"memory": survivor}, controller_url="http://controller",
                           node_token=lambda n: f"token-{n}", token_hasher=lambda t: f"hash-{t}")
    Reconciler(ctx).tick()
    assert len(survivor.nodes) == 1 and survivor.launch_calls == [crashing.node(job_id).id]
    assert crashing.node(job_id).state == "running" and len(crashing.store.attempts(job_id)) == 1
    assert crashing.store.job(job_id).state == "PROVISIONING"


def test_a_jobs_cost_is_the_sum_of_its_attempts_at_the_price_each_paid(world):
    """Two on-demand attempts (a failure, then a relaunch): each restart row costs its hours at the
    on-demand price, and the job's cost is their sum."""
    job_id = world.submit(resources={"spot_policy": "on-demand"})
    world.tick()
    world.register(job_id)
    end_attempt(world.store, job_id, 1, "failed", exit_code=1, now=time.time() + 1800)
    world.tick(2)
    world.register(job_id)
    end_attempt(world.store, job_id, 2, "failed", exit_code=1, now=time.time() + 3600)
    attempts = world.store.attempts(job_id)
    rows = [wire.restart_row(a) for a in attempts]
    assert [r["price_per_hour"] for r in rows] == [0.05, 0.05] and all(r["cost_usd"] > 0 for r in rows)
    assert rows[0]["cost_usd"] == pytest.approx(0.025, rel=0.01)
    summary = wire.job_summary(world.store.job(job_id), attempts)
    assert summary["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows), abs=1e-5)
