"""Releasing nodes: terminates go out on the cloud-call threads, are asked for again after a failure, and again
by a controller restarted while one was out (terminate is idempotent)."""

from __future__ import annotations

import time

import pytest

from runner.providers.memory import MemoryProvider
from runner.scheduler.reconciler import CANCEL_GRACE_SECONDS, threaded_calls
from runner.scheduler.releases import IGNORE, RETRY, TERMINATED, release_step

from scheduler_world import make_world
from ticking import start_jobs, tick_until


@pytest.fixture
def threaded(db_url):
    provider = MemoryProvider()
    world = make_world(db_url, provider, **threaded_calls(workers=4))
    yield world
    for release in (provider.release_launches, provider.release_describes, provider.release_terminates):
        release()
    for calls in (world.ctx.launches, world.ctx.describes, world.ctx.terminates):
        calls.shutdown()


def test_a_terminate_that_hangs_holds_up_no_other_job(threaded):
    """A's terminate hangs in the cloud; meanwhile B's lost node is noticed and C launches. Once the cloud
    answers, A's node is recorded as terminated."""
    world = threaded
    a, b = start_jobs(world, "a", "b")
    a_node = world.node(a).id
    world.provider.hold_terminates()
    world.cancel(a, at=time.time() - CANCEL_GRACE_SECONDS - 1)
    tick_until(world, lambda: world.ctx.terminates.in_flight(a_node), "a's terminate to go out")
    assert world.store.job(a).state == "CANCELLED" and world.store.node(a_node).state == "terminating"

    world.provider.lose(world.node(b).id)
    c = world.submit(name="c")
    tick_until(world, lambda: world.store.attempts(b)[0].end_reason == "lost"
               and world.store.job(c).state == "PROVISIONING", "b's loss and c's launch")
    assert world.store.node(a_node).state == "terminating" and world.ctx.terminates.in_flight(a_node)

    world.provider.release_terminates()
    tick_until(world, lambda: world.store.node(a_node).state == "terminated", "a's node to be released")
    assert a_node not in world.provider.alive()


def test_a_terminate_that_fails_is_asked_for_again_until_it_succeeds(db_url):
    """The cloud's API refuses the first terminate: the node stays terminating, and the next tick's succeeds."""
    world = make_world(db_url)
    job_id = world.submit()
    world.tick()
    world.register(job_id)
    node_id = world.node(job_id).id
    world.provider.fail_terminates(1)
    world.cancel(job_id, at=time.time() - CANCEL_GRACE_SECONDS - 1)
    world.tick()
    assert world.store.node(node_id).state == "terminating" and world.provider.alive() == [node_id]
    world.tick()
    assert world.store.node(node_id).state == "terminated" and world.provider.alive() == []
    assert world.provider.terminate_calls == [node_id, node_id]


def test_a_controller_restarted_while_a_terminate_is_out_terminates_the_node_again(threaded, db_url):
    """The controller stops with a terminate out and the node still terminating; the next one terminates it
    again and records it (the first controller's answer is never heard)."""
    world = threaded
    (job_id,) = start_jobs(world, "a")
    node_id = world.node(job_id).id
    world.provider.hold_terminates()
    world.cancel(job_id, at=time.time() - CANCEL_GRACE_SECONDS - 1)
    tick_until(world, lambda: world.ctx.terminates.in_flight(node_id), "the terminate to go out")

    restarted = make_world(db_url, world.provider)  # a new controller on the same database and cloud
    assert restarted.store.node(node_id).state == "terminating"
    world.provider.release_terminates()
    restarted.tick()
    assert restarted.store.node(node_id).state == "terminated" and world.provider.alive() == []
    assert world.provider.terminate_calls == [node_id, node_id]


@pytest.mark.parametrize("error, state_now, step", [
    (None, "terminating", TERMINATED),
    (RuntimeError("throttled"), "terminating", RETRY),
    (None, "terminated", IGNORE),  # another controller recorded it meanwhile
    (None, None, IGNORE),
])
def test_release_step(error, state_now, step):
    """What a terminate's answer means, as a pure function of its error and the node's state now."""
    assert release_step(error, state_now) == step
