"""Watching running nodes: describes go out on the cloud-call threads, so one that hangs holds up no other job,
and an answer that comes back after its node has moved on is ignored."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from runner.providers.base import NodeStatus
from runner.providers.memory import MemoryProvider, PerNodeMemoryProvider
from runner.scheduler.node_watch import gone_reason
from runner.scheduler.reconciler import CANCEL_GRACE_SECONDS, threaded_calls

from scheduler_world import make_world
from ticking import start_jobs, tick_until


def _threaded_world(db_url, provider):
    world = make_world(db_url, provider, **threaded_calls(workers=4))
    yield world
    for release in (provider.release_launches, provider.release_describes, provider.release_terminates):
        release()  # no call left waiting on a thread
    for calls in (world.ctx.launches, world.ctx.describes, world.ctx.terminates):
        calls.shutdown()


@pytest.fixture
def per_node(db_url):
    """A cloud that is described node by node, its calls on the controller's threads."""
    yield from _threaded_world(db_url, PerNodeMemoryProvider())


@pytest.fixture
def batched(db_url):
    """A provider described in one call a tick (the memory and local ones), on the controller's threads."""
    yield from _threaded_world(db_url, MemoryProvider())


def test_a_describe_that_hangs_holds_up_no_other_jobs_launch_cancel_or_loss(per_node):
    """Job A's describe hangs in the cloud; meanwhile job B's cancel ends it, job C's lost node is noticed, and
    job D launches; A's node is still being asked about, and A runs on."""
    world = per_node
    a, b, c = start_jobs(world, "a", "b", "c")
    held = world.node(a).id
    world.provider.hold_describes(held)
    # (a describe asked for before the hold may be out still, and answer: wait for one that hangs)
    tick_until(world, lambda: world.provider.describe_held(held), "a's describe to hang")

    world.cancel(b, at=time.time() - CANCEL_GRACE_SECONDS - 1)
    lost = world.node(c).id
    world.provider.lose(lost)
    d = world.submit(name="d")
    b_node = world.node(b).id
    tick_until(world, lambda: (world.store.job(b).state == "CANCELLED"
                               and world.store.node(b_node).state == "terminated"
                               and world.store.attempts(c)[0].end_reason == "lost"
                               and world.store.job(d).state == "PROVISIONING"), "b's cancel, c's loss and d's launch")
    assert lost in world.store.attempts(c)[0].message
    assert world.provider.describe_held(held) and world.ctx.describes.in_flight(held)
    assert world.store.job(a).state == "RUNNING"


def test_a_provider_whose_every_describe_hangs_holds_up_no_cancel_or_launch(batched):
    """The whole describe API hangs: cancels and launches go on regardless."""
    world = batched
    a, b = start_jobs(world, "a", "b")
    world.provider.hold_describes()
    tick_until(world, lambda: world.provider.describe_held(world.node(a).id), "a's describe to hang")
    world.cancel(b, at=time.time() - CANCEL_GRACE_SECONDS - 1)
    d = world.submit(name="d")
    tick_until(world, lambda: world.store.job(b).state == "CANCELLED" and world.store.job(d).state == "PROVISIONING",
               "b's cancel and d's launch")
    # b's terminate is asked for and answered on the provider's threads: a tick or two after the cancel
    tick_until(world, lambda: world.store.node(world.node(b).id).state == "terminated", "b's node released")
    assert world.provider.describe_held(world.node(a).id)  # with a's describe still hung all along
    assert world.ctx.describes.in_flight(world.node(a).id)


def test_a_describe_answer_about_a_node_released_meanwhile_is_ignored(per_node):
    """A's describe is out when A is cancelled and its node terminated; the late 'gone' answer ends nothing
    and does not take the terminated node back."""
    world = per_node
    (a,) = start_jobs(world, "a")
    node_id = world.node(a).id
    world.provider.hold_describes(node_id)
    tick_until(world, lambda: world.provider.describe_held(node_id), "a's describe to hang")
    world.cancel(a, at=time.time() - CANCEL_GRACE_SECONDS - 1)
    tick_until(world, lambda: world.store.node(node_id).state == "terminated", "a's node to be released")
    assert world.provider.nodes[node_id].state == "terminated"  # so the held describe will answer 'gone'

    world.provider.release_describes()
    tick_until(world, lambda: not world.ctx.describes.in_flight(node_id), "the late answer to be read")
    world.tick()
    (attempt,) = world.store.attempts(a)
    assert attempt.end_reason == "cancelled" and "gone" not in (attempt.message or "")
    assert world.store.job(a).state == "CANCELLED" and world.store.node(node_id).state == "terminated"
    assert world.provider.terminate_calls == [node_id]  # not released a second time


def test_a_provider_that_describes_in_batch_is_asked_once_a_tick(db_url):
    """Three running nodes on a batch provider: one describe call a tick covers them all."""
    world = make_world(db_url)
    jobs = [world.submit(name=name) for name in ("a", "b", "c")]
    world.tick()
    batches = []
    describe_many = world.provider.describe_many
    world.provider.describe_many = lambda nodes: batches.append(sorted(n for n, _ in nodes)) or describe_many(nodes)
    world.tick()
    assert batches == [sorted(world.node(j).id for j in jobs)]


def _node(state: str = "running", attempt: int = 1):
    return SimpleNamespace(state=state, attempt=attempt)


@pytest.mark.parametrize("status, node, reason", [
    (NodeStatus(alive=True), _node(), None),
    (NodeStatus(alive=False, reason="preempted"), _node(), "preempted"),
    (NodeStatus(alive=False, reason="not-found"), _node(), "lost"),
    (NodeStatus(alive=False, reason="terminated"), _node("draining"), "lost"),
    (NodeStatus(alive=False, reason="not-found"), _node("terminating"), None),  # released since it was asked
    (NodeStatus(alive=False, reason="not-found"), _node("terminated"), None),
    (NodeStatus(alive=False, reason="not-found"), _node(attempt=2), None),  # a newer attempt on the node
    (NodeStatus(alive=False, reason="not-found"), None, None),
])
def test_gone_reason_ends_only_the_attempt_that_was_asked_about(status, node, reason):
    """The decision on a describe answer, as a pure function of the answer, the attempt asked about and the node now."""
    assert gone_reason(status, 1, node) == reason


def test_with_a_clouds_describe_interval_the_running_nodes_are_read_a_few_times_an_interval(db_url):
    """A 10 s describe interval: ticks in between do not read the running nodes at all (at 2,000 nodes that read
    costs the API's event loop ~20 ms a tick); once a quarter interval has passed, a lost node is found."""
    world = make_world(db_url, PerNodeMemoryProvider())
    world.provider.describe_interval = 10.0
    job_id = world.submit()
    world.tick()
    world.register(job_id)
    reads = []
    watched_nodes = world.store.watched_nodes
    world.store.watched_nodes = lambda states: reads.append(states) or watched_nodes(states)
    world.tick(5)
    assert reads == []
    node_id = world.node(job_id).id
    world.provider.lose(node_id)
    world.ctx.watched_at -= 2.5  # a quarter interval later (the node, never described yet, is due)
    world.tick()
    assert len(reads) == 1 and world.store.attempts(job_id)[0].end_reason == "lost"
