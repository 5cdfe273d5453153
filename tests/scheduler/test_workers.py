"""The workers never wait on a cloud: a launch is asked for and answered later, and the cancel grace runs on
the scheduler's clock. Launches here run on the daemon's threads, as in the controller."""

from __future__ import annotations

import time

import pytest

from runner.scheduler.cloud_calls import CloudCalls
from runner.scheduler.reconciler import (CANCEL_GRACE_SECONDS, CANCEL_JOB, END_ATTEMPT, WAIT_FOR_AGENT,
                                         cancel_step)

from scheduler_world import make_world
from ticking import tick_returns, tick_until

@pytest.fixture
def world(db_url):
    world = make_world(db_url, launches=CloudCalls.threaded(4, "launch"))
    yield world
    world.provider.release_launches()  # no launch thread left waiting
    world.ctx.launches.shutdown()


def running(world, job_id: str) -> bool:
    return world.store.job(job_id).state == "PROVISIONING"


def test_a_launch_that_never_completes_holds_up_neither_a_cancel_nor_a_lost_node(world):
    """Job A's launch hangs in the cloud; in the same ticks job B's cancel ends it and job C's lost node is
    noticed and replaced."""
    b, c = world.submit(name="b"), world.submit(name="c")
    tick_until(world, lambda: running(world, b) and running(world, c), "b and c to launch")
    world.register(b)
    world.register(c)
    world.provider.hold_launches()
    a = world.submit(name="a")
    assert tick_returns(world)
    assert world.node(a).state == "launching" and world.ctx.launches.in_flight(world.node(a).id)

    world.cancel(b, at=time.time() - CANCEL_GRACE_SECONDS - 1)
    lost = world.node(c).id
    world.provider.lose(lost)
    assert tick_returns(world)
    assert world.store.job(b).state == "CANCELLED" and world.store.node(world.node(b).id).state == "terminated"
    ended = world.store.attempts(c)[0]
    assert ended.end_reason == "lost" and lost in ended.message
    assert world.store.job(a).state == "PENDING"  # still waiting on its cloud, and nothing else did


def test_a_node_released_while_its_launch_is_out_is_terminated_when_the_answer_comes(world):
    """Cancelled mid-launch: the job ends at once; the node the cloud then starts is terminated, not leaked."""
    world.provider.hold_launches()
    job_id = world.submit()
    assert tick_returns(world)
    world.cancel(job_id)
    assert tick_returns(world)
    assert world.store.job(job_id).state == "CANCELLED"
    node_id = world.node(job_id).id
    world.provider.release_launches()
    tick_until(world, lambda: world.store.node(node_id).state == "terminated", "the late node's release")
    assert world.provider.alive() == [] and world.provider.terminate_calls == [node_id]


class Clock:
    def __init__(self):
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clocked(db_url):
    clock = Clock()
    return make_world(db_url, clock=clock), clock


def test_the_cancel_grace_leaves_the_node_to_the_agent_then_takes_it(clocked):
    """Within CANCEL_GRACE_SECONDS of the cancel the job's agent stops it (SIGTERM, its checkpoint); only
    once the grace has passed without an exit report does the scheduler end the attempt and release the node."""
    world, clock = clocked
    job_id = world.submit()
    world.tick()
    world.register(job_id)
    world.cancel(job_id, at=clock.now)
    clock.now += CANCEL_GRACE_SECONDS - 0.5
    world.tick()
    assert world.store.job(job_id).state == "RUNNING" and world.provider.alive() == [world.node(job_id).id]
    clock.now += 1.0
    world.tick()
    (attempt,) = world.store.attempts(job_id)
    assert world.store.job(job_id).state == "CANCELLED" and world.provider.alive() == []
    assert attempt.end_reason == "cancelled" and attempt.ended_at == clock.now
    assert f"{CANCEL_GRACE_SECONDS:.0f}s" in attempt.message


def test_an_agent_that_stops_the_job_within_the_grace_frees_the_node_at_once(clocked):
    """The agent's exit report ends the attempt with the job's own exit code; the node goes on the next tick."""
    from runner.scheduler.attempts import end_attempt

    world, clock = clocked
    job_id = world.submit()
    world.tick()
    world.register(job_id)
    world.cancel(job_id, at=clock.now)
    clock.now += 3.0
    assert end_attempt(world.store, job_id, 1, "cancelled", exit_code=0, now=clock.now) == "CANCELLED"
    world.tick()
    assert world.provider.alive() == [] and world.store.attempts(job_id)[0].exit_code == 0


@pytest.mark.parametrize("waited, attempt_running, agent, step", [
    (0.0, True, True, WAIT_FOR_AGENT),
    (CANCEL_GRACE_SECONDS - 0.1, True, True, WAIT_FOR_AGENT),
    (CANCEL_GRACE_SECONDS, True, True, END_ATTEMPT),
    (0.0, True, False, END_ATTEMPT),  # no agent registered yet: nobody to stop the job but us
    (0.0, False, False, CANCEL_JOB),
])
def test_cancel_step_follows_the_grace(waited, attempt_running, agent, step):
    """The cancel decision as a pure function of when, whether an attempt runs, and whether its agent listens."""
    assert cancel_step(100.0, 100.0 + waited, attempt_running, agent) == step
