"""One job's failure inside a reconciler tick never stops the tick for the others.

A bug or a bad row in one job's work (its launch, its launch's answer, its cancel) is logged with the job
id, counted, and backed off; every other job goes through the tick, and every later worker of the tick
(node watch, cancels, releases, launches) still runs.
"""

from __future__ import annotations

import time

import pytest

from runner.providers.memory import MemoryProvider, memory_offers
from runner.scheduler import reconciler
from runner.scheduler.isolation import UnitGuard
from runner.scheduler.policy import BACKOFF_CAP_SECONDS, BackoffBook
from runner.scheduler.reconciler import CANCEL_GRACE_SECONDS

from database_probes import CountingTransactions
from scheduler_world import make_world


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def world(db_url, clock):
    return make_world(db_url, guard=UnitGuard(clock=clock))


def fail_for(monkeypatch, name: str, bad_job: str, job_of=lambda *args: args[1].id) -> list[str]:
    """Make reconciler.<name> raise for ``bad_job`` only; return the job ids it was called for."""
    original, calls = getattr(reconciler, name), []

    def step(*args):
        job_id = job_of(*args)
        calls.append(job_id)
        if job_id == bad_job:
            raise RuntimeError(f"injected failure for {job_id}")
        return original(*args)

    monkeypatch.setattr(reconciler, name, step)
    return calls


def running(world, name: str) -> str:
    job_id = world.submit(name=name)
    world.tick()
    world.register(job_id)
    return job_id


def test_a_failing_cancel_of_one_job_stops_nothing_else_in_the_tick(world, monkeypatch):
    """The cancel of one job raises: in the same tick another cancel, a preempted node, a release and a
    launch all happen, and the failure is counted."""
    preempted, broken, cancelled = running(world, "preempted"), running(world, "broken"), running(world, "cancelled")
    world.provider.preempt(world.node(preempted).id)
    long_ago = time.time() - CANCEL_GRACE_SECONDS - 1
    world.cancel(broken, at=long_ago)
    world.cancel(cancelled, at=long_ago)
    waiting = world.submit(name="waiting")
    fail_for(monkeypatch, "_apply_cancellation", broken)

    world.tick()

    assert world.store.job(cancelled).state == "CANCELLED"  # the other cancel (the same worker)
    assert world.store.attempts(preempted)[0].end_reason == "preempted"  # node watch (before the cancels)
    assert world.store.node(world.node(cancelled).id).state == "terminated"  # release (after them)
    assert world.store.job(waiting).state == "PROVISIONING"  # launch (last)
    assert world.store.job(broken).state == "RUNNING" and world.ctx.guard.failures == 1


def test_a_failing_launch_of_one_job_launches_every_other(world, monkeypatch, clock):
    """One job's launch raises: the jobs before and after it launch in the same tick; the broken one is not
    tried again every tick but after a backoff, and launches once its fault is gone."""
    jobs = [world.submit(name=f"job{i}") for i in range(5)]
    broken = jobs[2]
    calls = fail_for(monkeypatch, "_launch_job", broken)

    world.tick()
    assert [world.store.job(j).state for j in jobs] == ["PROVISIONING"] * 2 + ["PENDING"] + ["PROVISIONING"] * 2
    world.tick(5)
    assert calls.count(broken) == 1  # backed off: not retried in a hot loop
    clock.now += 1.5  # past its first backoff: tried again (and fails again: the backoff doubles)
    world.tick(3)
    assert calls.count(broken) == 2 and world.ctx.guard.failures == 2
    monkeypatch.undo()
    clock.now += 600
    world.tick()
    assert world.store.job(broken).state == "PROVISIONING"


def test_a_failing_launch_answer_of_one_job_is_applied_for_every_other(world, monkeypatch):
    """The first worker of a tick applies launch answers: one that raises (as the backoff's overflow once did on
    every tick) leaves the others' answers applied and the rest of the tick running."""
    jobs = [world.submit(name=f"job{i}") for i in range(3)]
    fail_for(monkeypatch, "_record_launch", jobs[1], job_of=lambda ctx, tx, node, answer: node.job_id)
    world.tick()
    states = [world.store.job(j).state for j in jobs]
    assert states == ["PROVISIONING", "PENDING", "PROVISIONING"] and world.ctx.guard.failures == 1
    calls = len(world.provider.launch_calls)
    world.tick(3)
    assert len(world.provider.launch_calls) == calls  # its node is not launched again every tick meanwhile


def test_a_launch_refused_after_ten_thousand_failures_is_backed_off_at_the_cap(db_url):
    """A one-zone market that has refused 10,000 launches (its backoff just over): the next refusal is recorded
    (it once overflowed the float there, on the first step of every tick) and the job waits, saying why."""
    world = make_world(db_url, provider=MemoryProvider(memory_offers(("mem-a",))))
    key = ["memory", "mem-a", "mem-cpu-2"]
    world.ctx.backoff = BackoffBook.from_dict({"entries": [{"key": key, "failures": 10_000, "until": time.time() - 1}]})
    world.provider.refuse(times=1)
    job_id = world.submit()
    world.tick()
    assert world.ctx.guard.failures == 0
    assert world.ctx.backoff.remaining(key, time.time()) > BACKOFF_CAP_SECONDS - 60
    job = world.store.job(job_id)
    assert job.state == "PENDING" and "no capacity" in job.message


def test_the_launch_answers_of_a_tick_are_applied_in_one_transaction(world):
    """Five launched nodes' answers take one transaction (each of its own paid a BEGIN, the write lock and a flushed
    commit while other writers waited), and every job provisions."""
    jobs = [world.submit(name=f"job{i}") for i in range(5)]
    reconciler.launch_pending_jobs(world.ctx)  # the launches are asked for (and answered: the provider is inline)
    assert [world.store.job(j).state for j in jobs] == ["PENDING"] * 5
    counting = CountingTransactions(world.store.db)
    world.store.db = counting
    try:
        reconciler.collect_launches(world.ctx)
    finally:
        world.store.db = counting.db
    assert counting.count == 1
    assert [world.store.job(j).state for j in jobs] == ["PROVISIONING"] * 5
