"""A node that registers, runs and reports its exit before its launch's answer is applied (a tick late under
load, a launch asked for again after a failover): the job still PENDING or RECOVERING then. Each report gets a
defined answer, never a 500 (once: `InvalidTransition PENDING -> SUCCEEDED` for some 20 s at 10,000 jobs)."""

from __future__ import annotations


import pytest
from fastapi.testclient import TestClient

from runner.controller.app import ControllerState, create_app
from runner.controller.auth import hash_token
from runner.controller.logstore import LogStore
from runner.scheduler.attempts import end_attempt
from runner.scheduler.cloud_calls import CloudCalls

from scheduler_world import make_world
from ticking import tick_until

ADMIN = "admin-token"


@pytest.fixture
def world(db_url):
    launches = CloudCalls.threaded(2, "launch")
    world = make_world(db_url, launches=launches)
    world.ctx.token_hasher = hash_token  # node tokens the agent API accepts
    yield world
    world.provider.release_launches()
    launches.shutdown()


@pytest.fixture
def api(world, tmp_path):
    state = ControllerState(world.store, ADMIN, tmp_path, LogStore(tmp_path / "logs"), world.ctx)
    with TestClient(create_app(state), raise_server_exceptions=False) as client:
        yield client


def launched_but_unrecorded(world, job_id: str) -> dict:
    """The job's attempt and node row are written and its launch is out, its answer not applied yet; the headers
    of that node's token."""
    world.provider.hold_launches()
    world.tick()
    return {"Authorization": f"Bearer {world.ctx.node_token(world.node(job_id).id)}"}


@pytest.mark.parametrize("reason, exit_code, final", [("succeeded", 0, "SUCCEEDED"), ("failed", 1, "RECOVERING")])
def test_a_node_that_runs_and_exits_before_its_launch_is_recorded_ends_its_attempt(world, api, reason, exit_code,
                                                                                   final):
    job_id = world.submit()
    headers = launched_but_unrecorded(world, job_id)
    assert world.store.job(job_id).state == "PENDING"

    registered = api.post("/v1/agent/register", headers=headers)
    assert registered.status_code == 200 and world.store.job(job_id).state == "RUNNING"
    exited = api.post("/v1/agent/exit", headers=headers, json={"reason": reason, "exit_code": exit_code})
    assert exited.status_code == 200, exited.text
    assert exited.json()["state"] == final == world.store.job(job_id).state
    (attempt, *_) = world.store.attempts(job_id)
    assert attempt.end_reason == reason and attempt.exit_code == exit_code
    states = [e.to_state for e in world.store.events(job_id) if e.kind == "state"]
    assert states[:4] == ["PENDING", "PROVISIONING", "RUNNING", final]

    world.provider.release_launches()  # the answer comes at last: the node it names is let go
    node_id = world.store.attempts(job_id)[0].node_id
    tick_until(world, lambda: world.store.node(node_id).state == "terminated", "the late-launched node's release")


def test_an_exit_report_of_a_relaunched_job_before_its_launch_is_recorded_ends_its_attempt(world, api):
    """RECOVERING with the next attempt's node up and reporting: the job passes PROVISIONING, RUNNING, ends."""
    job_id = world.submit()
    tick_until(world, lambda: world.store.job(job_id).state == "PROVISIONING", "the first launch")
    world.register(job_id)
    assert end_attempt(world.store, job_id, 1, "failed", exit_code=1) == "RECOVERING"
    headers = launched_but_unrecorded(world, job_id)  # the first node released, the second asked for
    assert world.store.job(job_id).state == "RECOVERING" and len(world.store.attempts(job_id)) == 2
    assert api.post("/v1/agent/register", headers=headers).status_code == 200
    exited = api.post("/v1/agent/exit", headers=headers, json={"reason": "succeeded", "exit_code": 0})
    assert exited.status_code == 200 and world.store.job(job_id).state == "SUCCEEDED"
    world.provider.release_launches()


def test_an_exit_report_the_job_cannot_take_is_a_409_and_changes_nothing(world, api, monkeypatch):
    """A report no state change fits (here forced: the job's state edited under it) is refused with a 409 that
    says why, never a 500, and the job stays as it was."""
    job_id = world.submit()
    world.ctx.launches = CloudCalls()  # inline: launched and recorded in the tick
    world.tick()
    world.register(job_id)
    headers = {"Authorization": f"Bearer {world.ctx.node_token(world.node(job_id).id)}"}
    with world.store.db.transaction() as tx:
        tx.execute("UPDATE jobs SET state = 'SUCCEEDED' WHERE id = ?", (job_id,))
    exited = api.post("/v1/agent/exit", headers=headers, json={"reason": "failed", "exit_code": 1})
    assert exited.status_code == 409 and "not applied" in exited.json()["detail"], exited.text
    assert world.store.job(job_id).state == "SUCCEEDED"
    assert world.store.attempts(job_id)[0].end_reason == "running"
