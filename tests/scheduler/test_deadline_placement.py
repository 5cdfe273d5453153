"""spot_policy auto with recovery.deadline, through the reconciler and the restart log's HTTP API.

A job's first attempt has run an hour and committed step 1,000 of 10,000 before a preemption (9 h of
work left at its measured speed); its relaunch goes on-demand when the deadline leaves no room for spot,
and on spot when it does, with the reason in the restart log's message and in `status`.
"""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from runner.controller.app import ControllerState, create_app
from runner.controller.logstore import LogStore
from runner.providers.memory import MemoryProvider, memory_offers
from runner.scheduler.attempts import end_attempt
from runner.scheduler.policy import BackoffBook
from runner.state.values import Notice

from scheduler_world import make_world

ADMIN = "admin-token"


@pytest.fixture
def world(db_url):
    return make_world(db_url, MemoryProvider(memory_offers(("zone-a", "zone-b"))))


def first_hour_then_preempted(world, job_id: str) -> None:
    """Attempt 1 ran an hour, committed step 1000 (durable), and was preempted after a notice."""
    world.tick()
    now = time.time()
    with world.store.db.transaction() as tx:
        world.store.mark_attempt_running(tx, job_id, 1, now - 3600)
        world.store.record_checkpoint(tx, job_id, 1, {"step": 1000, "time": now, "durable": True})
    end_attempt(world.store, job_id, 1, "preempted", notice=Notice.from_json({"source": "aws", "action": "terminate"}))
    world.tick()  # releases the node, then places the relaunch


def restart_log(world, job_id: str, tmp_path) -> tuple[list[dict], dict]:
    state = ControllerState(world.store, ADMIN, tmp_path, LogStore(tmp_path / "logs"), world.ctx)
    with TestClient(create_app(state)) as client:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        rows = client.get(f"/v1/jobs/{job_id}/restarts", headers=headers).json()
        job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    return rows, job


def submit(world, deadline: str) -> str:
    return world.submit(resources={"spot_policy": "auto"},
                        recovery={"resume_drill": "off", "deadline": deadline, "total_steps": 10000})


def test_a_tight_deadline_relaunches_on_demand_and_says_why(world, tmp_path):
    job_id = submit(world, "9h10m")
    first_hour_then_preempted(world, job_id)
    rows, job = restart_log(world, job_id, tmp_path)
    assert [row["spot"] for row in rows] == [True, False]
    assert "no speed measured yet" in rows[0]["message"]  # before a checkpoint: spot, like any auto job
    assert rows[1]["message"].startswith("on-demand: 9.0 h of work left, 9.2 h to the deadline, spot would need")
    assert job["cost_policy"] == rows[1]["message"]


def test_status_shows_the_running_attempt_as_the_restart_log_does_with_why_its_market_was_chosen(world, tmp_path):
    """`runner status --json`'s current_attempt is the running attempt's restart-log row: the same message."""
    job_id = submit(world, "9h10m")
    first_hour_then_preempted(world, job_id)
    rows, job = restart_log(world, job_id, tmp_path)
    assert rows[-1]["end_reason"] == "running" and rows[-1]["message"].startswith("on-demand: ")
    current = job["current_attempt"]
    assert {k: current[k] for k in ("attempt", "message", "launch_failures", "events")} == \
        {k: rows[-1][k] for k in ("attempt", "message", "launch_failures", "events")}


def test_a_deadline_with_slack_relaunches_on_spot_away_from_the_preempting_zone(world, tmp_path):
    job_id = submit(world, "48h")
    first_hour_then_preempted(world, job_id)
    rows, _ = restart_log(world, job_id, tmp_path)
    assert [(row["spot"], row["zone"]) for row in rows] == [(True, "zone-a"), (True, "zone-b")]
    assert rows[1]["message"].startswith("spot: 9.0 h of work left, 48.0 h to the deadline, spot would need 9.1 h")


def test_a_job_without_a_deadline_is_placed_as_before(world, tmp_path):
    job_id = world.submit(resources={"spot_policy": "auto"})
    world.tick()
    rows, job = restart_log(world, job_id, tmp_path)
    assert rows[0]["spot"] and rows[0]["message"] is None and job["cost_policy"] is None


@pytest.mark.parametrize("deadline, placed", [("48h", None), ("9h20m", "on-demand")])
def test_without_spot_capacity_it_waits_while_the_deadline_allows_else_goes_on_demand(db_url, deadline, placed):
    """Both zones' spot backed off for an hour after capacity errors: with slack the job waits for spot and
    says so; with 9 h of work and 9 h 20 min left it launches on-demand now."""
    world = make_world(db_url, MemoryProvider(memory_offers(("zone-a", "zone-b"))),
                       backoff=BackoffBook(base=3600, cap=3600))
    job_id = submit(world, deadline)
    world.tick()
    for zone in ("zone-a", "zone-b"):
        world.ctx.backoff.record_failure(("memory", zone), time.time())
    now = time.time()
    with world.store.db.transaction() as tx:
        world.store.mark_attempt_running(tx, job_id, 1, now - 3600)
        world.store.record_checkpoint(tx, job_id, 1, {"step": 1000, "time": now, "durable": True})
    end_attempt(world.store, job_id, 1, "preempted", notice=Notice.from_json({"source": "aws", "action": "terminate"}))
    world.tick()
    attempts = world.store.attempts(job_id)
    if placed is None:
        assert len(attempts) == 1 and world.store.job(job_id).state == "RECOVERING"
        assert world.store.job(job_id).message.startswith("waiting for spot: no spot capacity now; 9.0 h of work")
    else:
        assert len(attempts) == 2 and not attempts[1].spot
        assert world.events(job_id, "placement")[-1].endswith("no spot capacity now, and no time to wait for it")
