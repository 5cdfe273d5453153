"""Requests an attacker or a broken agent sends: refused with 401 or 422 naming the field, never a 500."""

from __future__ import annotations

import pytest
import requests


from conftest import controller_with_a_sleeping_job

@pytest.fixture(scope="module")
def server(tmp_path_factory, module_controller_db):
    """One controller for the module, with one running job and the headers of its node's token."""
    with controller_with_a_sleeping_job(tmp_path_factory.mktemp("hostile"), module_controller_db) as server:
        yield server


def test_a_non_ascii_bearer_token_is_401(server):
    """A token with non-ASCII characters is a wrong token (401), not a crash in the comparison (500)."""
    headers = {"Authorization": "Bearer t\u00f6ken-\u00e9\u00e9".encode().decode("latin-1")}
    assert requests.get(server.controller.url + "/v1/jobs", headers=headers, timeout=10).status_code == 401


def test_the_api_description_is_not_served_without_a_token(server):
    """/openapi.json does not hand the API's description to anyone who asks."""
    response = requests.get(server.controller.url + "/openapi.json", timeout=10)
    assert response.status_code in (401, 404) and "paths" not in response.text


def test_a_malformed_body_without_a_token_is_401_not_422(server):
    """The token is checked before the body: a caller without one is told nothing about the body."""
    response = requests.post(server.controller.url + "/v1/jobs", data=b"{not json", timeout=10,
                             headers={"content-type": "application/json"})
    assert response.status_code == 401


def test_an_event_cursor_beyond_64_bits_is_422(server):
    """events?after=2**70 is refused naming the parameter instead of overflowing SQLite (500)."""
    response = requests.get(f"{server.controller.url}/v1/jobs/{server.job_id}/events", params={"after": 2**70},
                            headers=server.controller.headers(), timeout=10)
    assert response.status_code == 422 and "after" in response.json()["detail"]


def test_agent_output_that_is_not_base64_is_422(server):
    """A log chunk with bad base64 is refused naming data_b64 instead of failing the decode (500)."""
    response = requests.post(server.controller.url + "/v1/agent/logs", timeout=10, headers=server.node_headers,
                             json={"offset": 0, "data_b64": "@@not base64@@"})
    assert response.status_code == 422 and "data_b64" in response.json()["detail"]


@pytest.mark.parametrize("step", ["abc", -5, 2**70, True])
def test_a_checkpoint_report_whose_step_is_not_a_step_is_refused_and_not_shown(server, step):
    """A durable checkpoint 'at step abc' or '-5' is refused (422) and the job's step stays as it was."""
    response = requests.post(server.controller.url + "/v1/agent/events", headers=server.node_headers, timeout=10,
                             json={"kind": "checkpoint", "data": {"step": step, "durable": True, "seconds": 0.1}})
    assert response.status_code == 422 and "step" in response.json()["detail"]
    assert server.runner.json("status", server.job_id)["step"] == 0


def test_a_heartbeat_with_a_step_that_is_not_a_step_is_refused(server):
    """Progress 'checkpoint_step: abc' in a heartbeat, shown by `runner status`, is refused (422)."""
    response = requests.post(server.controller.url + "/v1/agent/heartbeat", headers=server.node_headers, timeout=10,
                             json={"phase": "running", "progress": {"checkpoint_step": "abc"}})
    assert response.status_code == 422 and "progress.checkpoint_step" in response.json()["detail"]


@pytest.mark.parametrize("recovery, key", [
    ({"deadline": "0001-01-01T00:00:00+14:00", "total_steps": 100}, "recovery.deadline"),
    ({"deadline": "99999999999999999999d", "total_steps": 100}, "recovery.deadline"),
    ({"deadline": "\uff13\uff16h", "total_steps": 100}, "recovery.deadline"),  # full-width digits: "３６h"
    ({"deadline": "36h", "total_steps": 2**63}, "recovery.total_steps"),
])
def test_a_submitted_recovery_that_makes_no_sense_is_422_naming_the_key(server, recovery, key):
    """A deadline in the year 0 (a 500 once), twenty digits of days, full-width digits or 2**63 steps (all
    once accepted) are refused naming the key, and no job is stored."""
    before = len(server.runner.json("jobs"))
    response = requests.post(server.controller.url + "/v1/jobs", headers=server.controller.headers(), timeout=10,
                             json={"spec": {"name": "nonsense", "run": "true", "recovery": recovery}})
    assert response.status_code == 422 and key in response.json()["detail"], response.text
    assert len(server.runner.json("jobs")) == before


def test_a_megabyte_workdir_digest_is_422_naming_the_field(server):
    """workdir_digest names a file under the data dir: anything but a sha256 is refused, not looked up."""
    for digest in ("a" * 1_000_000, "../../../etc/passwd", ""):
        response = requests.post(server.controller.url + "/v1/jobs", headers=server.controller.headers(), timeout=10,
                                 json={"spec": {"name": "digest", "run": "true"}, "workdir_digest": digest})
        assert response.status_code == 422 and "workdir_digest" in response.json()["detail"]
        assert len(response.content) < 2000  # the refusal does not echo a megabyte back
