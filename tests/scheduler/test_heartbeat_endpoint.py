"""The agent's heartbeat (runner/controller/heartbeat_api.py): its token checks, its body checks and its answer,
read fresh on every beat, through the real app on the in-memory provider."""

from __future__ import annotations

import base64
import time

import pytest
from fastapi.testclient import TestClient

from runner.controller.app import ControllerState, create_app
from runner.controller.logstore import LogStore
from runner.scheduler.attempts import end_attempt
from runner.scheduler.cloud_calls import CloudCalls

from api_world import api, world  # noqa: F401 - pytest fixtures
from scheduler_world import ADMIN, agent_api_world

BEAT = {"phase": "running", "progress": {"checkpoint_step": 100}}


def running_job(world) -> tuple[str, dict]:
    """A running job and the headers of its node's token."""
    job_id = world.submit()
    world.tick()
    world.register(job_id)
    world.tick()
    return job_id, {"Authorization": f"Bearer {world.ctx.node_token(world.node(job_id).id)}"}


def beat(api, headers, body=BEAT):
    return api.post("/v1/agent/heartbeat", json=body, headers=headers)


def test_a_running_node_is_told_to_continue_and_its_progress_is_kept(world, api):
    job_id, headers = running_job(world)
    assert beat(api, headers).json() == {"action": "continue"}
    api.controller.heartbeats.flush()
    node = world.node(job_id)
    assert node.progress == {"phase": "running", "checkpoint_step": 100} and node.last_heartbeat > 0


def test_the_answer_follows_the_database_on_the_very_next_beat(world, api):
    """A cancel, then the node's release, written by anyone sharing the database, answer the next beat."""
    job_id, headers = running_job(world)
    world.cancel(job_id)
    assert beat(api, headers).json() == {"action": "cancel"}
    with world.store.db.transaction() as tx:
        world.store.update_node(tx, world.node(job_id).id, state="terminating")
    assert beat(api, headers).json() == {"action": "shutdown"}
    with world.store.db.transaction() as tx:
        world.store.update_node(tx, world.node(job_id).id, state="terminated", terminated_at=time.time())
    assert beat(api, headers).status_code == 401


def test_a_node_whose_attempt_has_ended_is_told_to_shut_down(world, api):
    job_id, headers = running_job(world)
    end_attempt(world.store, job_id, 1, "preempted")
    assert beat(api, headers).json() == {"action": "shutdown"}


def test_only_a_node_token_may_beat(world, api):
    """No token: 401 asking for one; a wrong token: 401; the admin's: 403 (as every agent endpoint answers)."""
    running_job(world)
    missing = beat(api, {})
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert beat(api, {"Authorization": "Bearer wrong"}).status_code == 401
    assert beat(api, {"Authorization": f"Bearer {ADMIN}"}).status_code == 403


@pytest.mark.parametrize("body,field", [
    ({"phase": 3}, "body.phase"),
    ({"progress": [1, 2]}, "body.progress"),
    ({"progress": {"checkpoint_step": "abc"}}, "progress.checkpoint_step"),
    ({"progress": {"checkpoint_step": -1}}, "progress.checkpoint_step"),
    ([1, 2], "body"),
])
def test_a_malformed_beat_is_422_naming_the_field_and_is_not_kept(world, api, body, field):
    job_id, headers = running_job(world)
    reply = beat(api, headers, body)
    assert reply.status_code == 422 and reply.json()["detail"].startswith(field)
    api.controller.heartbeats.flush()
    assert world.node(job_id).progress is None


def test_a_body_that_is_not_json_is_422_with_a_token_and_401_without(world, api):
    _, headers = running_job(world)
    raw = {"content": b"{not json", "headers": {**headers, "content-type": "application/json"}}
    assert api.post("/v1/agent/heartbeat", **raw).status_code == 422
    assert api.post("/v1/agent/heartbeat", content=b"{not json").status_code == 401
    assert api.post("/v1/agent/heartbeat", headers=headers).status_code == 422  # no body at all


def test_an_empty_beat_means_running_without_progress(world, api):
    """The agent's defaults: phase running, no progress (as the model the endpoint had before)."""
    job_id, headers = running_job(world)
    assert beat(api, headers, {}).json() == {"action": "continue"}
    api.controller.heartbeats.flush()
    assert world.node(job_id).progress == {"phase": "running"}


def test_the_heartbeat_takes_only_a_post_and_a_small_body(world, api):
    """The heartbeat is served in front of the framework: a GET is still 405 naming POST, and a body far larger
    than any beat is refused (413) before it is parsed, and not kept."""
    job_id, headers = running_job(world)
    got = api.get("/v1/agent/heartbeat", headers=headers)
    assert got.status_code == 405 and got.headers["allow"] == "POST"
    huge = {"phase": "running", "progress": {"note": "x" * 100_000}}
    refused = beat(api, headers, huge)
    assert refused.status_code == 413 and "at most" in refused.json()["detail"]
    api.controller.heartbeats.flush()
    assert world.node(job_id).progress is None


def test_a_database_error_during_a_beat_is_a_500_and_the_next_beat_is_answered(world, api, monkeypatch):
    job_id, headers = running_job(world)

    def broken(token_hashes):
        raise RuntimeError("database went away")

    monkeypatch.setattr(world.store, "heartbeat_views", broken)
    reply = beat(api, headers)
    assert reply.status_code == 500 and reply.json() == {"detail": "Internal Server Error"}
    monkeypatch.undo()
    assert beat(api, headers).json() == {"action": "continue"}


# --- log chunks (runner/controller/log_api.py), answered by the same front door ---------------------------
def send_chunk(api, headers, body):
    return api.post("/v1/agent/logs", json=body, headers=headers)


def test_a_log_chunk_is_appended_once_and_a_resend_is_not_written_twice(world, api, tmp_path):
    job_id, headers = running_job(world)
    first = send_chunk(api, headers, {"offset": 0, "data_b64": base64.b64encode(b"step 1\n").decode()})
    assert first.json() == {"offset": 7}
    again = send_chunk(api, headers, {"offset": 0, "data_b64": base64.b64encode(b"step 1\nstep 2\n").decode()})
    assert again.json() == {"offset": 14}
    gap = send_chunk(api, headers, {"offset": 99, "data_b64": base64.b64encode(b"lost?\n").decode()})
    assert gap.json() == {"offset": 14}  # a gap is refused: the agent resends from here
    assert api.controller.logs.read(job_id, 1) == b"step 1\nstep 2\n"


@pytest.mark.parametrize("body,field", [
    ({"data_b64": ""}, "body.offset"),
    ({"offset": -1, "data_b64": ""}, "body.offset"),
    ({"offset": "0", "data_b64": ""}, "body.offset"),
    ({"offset": True, "data_b64": ""}, "body.offset"),
    ({"offset": 2**70, "data_b64": ""}, "body.offset"),
    ({"offset": 0}, "body.data_b64"),
    ({"offset": 0, "data_b64": 5}, "body.data_b64"),
    ({"offset": 0, "data_b64": "@@not base64@@"}, "data_b64"),
    ([0], "body"),
])
def test_a_malformed_log_chunk_is_422_naming_the_field_and_nothing_is_written(world, api, body, field):
    job_id, headers = running_job(world)
    reply = send_chunk(api, headers, body)
    assert reply.status_code == 422 and reply.json()["detail"].startswith(field)
    assert api.controller.logs.read(job_id, 1) == b""


def test_only_a_node_token_may_send_output(world, api):
    running_job(world)
    chunk = {"offset": 0, "data_b64": ""}
    assert send_chunk(api, {}, chunk).status_code == 401
    assert send_chunk(api, {"Authorization": "Bearer wrong"}, chunk).status_code == 401
    assert send_chunk(api, {"Authorization": f"Bearer {ADMIN}"}, chunk).status_code == 403


def test_an_agent_that_beats_before_its_launch_is_applied_keeps_running(db_url, tmp_path):
    """The node's launch answer is not applied yet (the next leader asked for it again after a failover, or the
    tick is late) while its agent already registers and beats: it is told to continue, never to shut down (its
    agent would stop the job and report it cancelled), and once the answer is applied the job is RUNNING."""
    world = agent_api_world(db_url, launches=CloudCalls.threaded(2, "launch"))
    world.provider.hold_launches()
    job_id = world.submit()
    world.tick()  # the node row is written and its launch is out
    headers = {"Authorization": f"Bearer {world.ctx.node_token(world.node(job_id).id)}"}
    state = ControllerState(world.store, ADMIN, tmp_path, LogStore(tmp_path / "logs"), world.ctx)
    try:
        with TestClient(create_app(state)) as api:
            assert api.post("/v1/agent/register", json={}, headers=headers).status_code == 200
            assert beat(api, headers).json() == {"action": "continue"}
            world.provider.release_launches()
            deadline = time.monotonic() + 60
            while world.store.job(job_id).state != "RUNNING":
                assert time.monotonic() < deadline, world.store.job(job_id)
                world.tick()
                world.ctx.nudge.wait(0.05)
                world.ctx.nudge.clear()
            assert beat(api, headers).json() == {"action": "continue"}
    finally:
        world.provider.release_launches()
        world.ctx.launches.shutdown()


# --- reports (runner/controller/event_api.py), answered by the same front door on a thread ----------------
@pytest.mark.parametrize("body,field", [
    ({"data": {}}, "body.kind"),
    ({"kind": 7}, "body.kind"),
    ({"kind": "checkpoint", "data": [1]}, "body.data"),
    ({"kind": "checkpoint", "data": {"step": "abc", "durable": True}}, "data.step"),
    ("not an object", "body"),
])
def test_a_malformed_report_is_422_naming_the_field_and_changes_nothing(world, api, body, field):
    job_id, headers = running_job(world)
    reply = api.post("/v1/agent/events", json=body, headers=headers)
    assert reply.status_code == 422 and reply.json()["detail"].startswith(field)
    assert world.store.job(job_id).step == 0


def test_a_durable_checkpoint_report_is_kept_and_only_a_node_may_send_one(world, api):
    job_id, headers = running_job(world)
    report = {"kind": "checkpoint", "data": {"step": 300, "durable": True, "seconds": 0.2}}
    assert api.post("/v1/agent/events", json=report, headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 403
    assert api.post("/v1/agent/events", json=report).status_code == 401
    assert api.post("/v1/agent/events", json=report, headers=headers).json() == {"accepted": True}
    assert world.store.job(job_id).step == 300
