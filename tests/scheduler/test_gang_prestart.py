"""When a gang trained through a notice hands over: the other nodes' processes started ahead are waited for, but
never for ever, and never past one that failed (runner/scheduler/gang_prestart.py)."""

from __future__ import annotations

from runner.scheduler.gang_prestart import WAIT_SECONDS, every_node_waits, holds_the_handover


def test_the_handover_waits_until_every_node_waits():
    started = {"port": 29600, "started_at": 90.0, "nodes": {"1": "waiting", "0": "started"}}
    assert holds_the_handover(started, 2, ready_at=100.0, now=101.0)
    waiting = {**started, "nodes": {"1": "waiting", "0": "waiting"}}
    assert every_node_waits(waiting, 2) and not holds_the_handover(waiting, 2, ready_at=100.0, now=101.0)


def test_a_failed_node_or_the_bound_ends_the_wait():
    failed = {"port": 29600, "started_at": 90.0, "nodes": {"1": "waiting", "0": "failed"}}
    assert not holds_the_handover(failed, 2, ready_at=100.0, now=101.0) and not every_node_waits(failed, 2)
    slow = {"port": 29600, "started_at": 90.0, "nodes": {"1": "waiting"}}
    assert holds_the_handover(slow, 2, ready_at=100.0, now=100.0 + WAIT_SECONDS - 1)
    assert not holds_the_handover(slow, 2, ready_at=100.0, now=100.0 + WAIT_SECONDS + 1)


def test_without_a_start_ahead_nothing_is_held():
    assert not holds_the_handover(None, 2, ready_at=100.0, now=100.0)
    # ready, but its process could not be started ahead: nothing started, nothing to wait for
    assert not holds_the_handover({"port": 29600, "nodes": {}}, 2, ready_at=100.0, now=100.0)


def test_a_gang_stopped_by_its_deadline_waits_for_processes_nearly_ready_but_not_for_ever():
    """The notice's deadline stopped the gang before every node's processes waited: the next attempt waits for the
    replacement's setup and then for them (bounded), but not for a node that failed."""
    from runner.scheduler.gang_prestart import PLAN_WAIT_SECONDS, SETUP_WAIT_SECONDS, defers_the_plan

    setting_up = {"launched_at": 50.0, "prestart": {"port": 29600, "nodes": {}}}
    assert defers_the_plan(setting_up, 2, now=110.0)
    assert not defers_the_plan(setting_up, 2, now=50.0 + SETUP_WAIT_SECONDS + 1)
    starting = {"launched_at": 50.0,
                "prestart": {"port": 29600, "started_at": 100.0, "nodes": {"1": "waiting", "0": "started"}}}
    assert defers_the_plan(starting, 2, now=110.0)
    assert not defers_the_plan(starting, 2, now=100.0 + PLAN_WAIT_SECONDS + 1)
    for nodes, deferred in (({"1": "waiting", "0": "waiting"}, False), ({"1": "waiting", "0": "failed"}, False)):
        assert defers_the_plan({**starting, "prestart": {**starting["prestart"], "nodes": nodes}}, 2, 110.0) == deferred
    assert not defers_the_plan({"launched_at": 50.0}, 2, now=60.0)  # nothing started ahead: planned at once
    # ready without starting ahead (its process could not be started): planned at once
    assert not defers_the_plan({**setting_up, "ready_at": 100.0}, 2, now=110.0)


def test_a_gpu_gang_is_started_ahead_too():
    """Its nodes' processes hold before their first CUDA use (runner/checkpoint/cuda_gate.py), so a gang with
    accelerators gets a start ahead as a CPU one does; an elastic gang and a single node do not."""
    from runner.scheduler.gang_prestart import allowed
    from runner.state.rows import Job
    from tests.stored import job_spec

    def job(**resources) -> Job:
        return Job("j", "job", job_spec(resources=resources), "running", 0.0, 0.0, None, 0, 0, 0, None, None, None)

    assert allowed(job(num_nodes=2, accelerators="A100:8"))
    assert allowed(job(num_nodes=2))
    assert not allowed(job(num_nodes=2, min_nodes=1, accelerators="A100:8"))
    assert not allowed(job(accelerators="A100:8"))
