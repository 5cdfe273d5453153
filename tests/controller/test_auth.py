"""Every endpoint needs a token; a node's token reaches only its own job."""

from __future__ import annotations


import pytest
import requests
import yaml
from fastapi.routing import APIRoute

from conftest import Controller, write_job
from runner.controller import agent_api, api, event_api, heartbeat_api, log_api, metrics

SLEEPER = """
name: sleeper
run: sleep 600
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""


def _routes(router) -> list[tuple[str, str]]:
    out = []
    for route in router.routes:
        if isinstance(route, APIRoute):
            path = route.path.replace("{job_id}", "JOB")
            out.extend((method, path) for method in route.methods)
    return out


ADMIN_ROUTES = _routes(api.router) + _routes(metrics.router)
# With the agent requests answered in front of the framework (runner/controller/front_door.py), all POST.
AGENT_ROUTES = _routes(agent_api.router) + [("POST", path) for path in (heartbeat_api.HEARTBEAT_PATH, log_api.LOGS_PATH,
                                                                         event_api.EVENTS_PATH)]


def _call(controller, method, path, token=None, job_id="none"):
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return requests.request(method, controller.url + path.replace("JOB", job_id), headers=headers,
                            json={}, params={"attempt": 1}, timeout=10)


@pytest.fixture(scope="module")
def doors(tmp_path_factory, module_controller_db):
    """One controller for the tests that only knock: nothing they send is accepted, so they can share it."""
    home = tmp_path_factory.mktemp("auth") / "home"
    home.mkdir()
    controller = Controller(home, db_url=module_controller_db).start()
    yield controller
    controller.stop()


@pytest.fixture
def two_jobs(tmp_path, runner, controller, home):
    """Two running jobs and the token of each one's node."""
    tokens = {}
    for name in ("a", "b"):
        job_id = runner.json("submit", str(write_job(tmp_path / name, SLEEPER)))["id"]
        runner.wait_for(job_id, lambda j: j["state"] == "RUNNING", what="running")
        tokens[job_id] = next(
            yaml.safe_load(c.read_text())["token"] for c in home.glob("nodes/*/agent.yaml")
            if yaml.safe_load(c.read_text())["node_id"] == runner.json("status", job_id)["current_attempt"]["node"]
        )
    return tokens


@pytest.mark.parametrize("method,path", ADMIN_ROUTES + AGENT_ROUTES)
def test_no_token_and_wrong_token_are_refused(doors, method, path):
    """Without a token, or with a wrong one, every endpoint answers 401."""
    assert _call(doors, method, path).status_code == 401
    assert _call(doors, method, path, token="wrong").status_code == 401


def test_node_token_cannot_use_admin_endpoints_or_reach_another_job(controller, two_jobs):
    """A node's token gets 403 on admin endpoints and on every other job; it can read its own job."""
    (job_a, token_a), (job_b, _) = two_jobs.items()
    for method, path in ADMIN_ROUTES:
        assert _call(controller, method, path, token_a, job_b).status_code == 403, (method, path)
    assert _call(controller, "GET", "/v1/jobs/JOB", token_a, job_a).status_code == 200


def test_admin_token_cannot_act_as_a_node(doors):
    """Agent endpoints need a node's own token, not the admin token."""
    for method, path in AGENT_ROUTES:
        assert _call(doors, method, path, doors.token).status_code == 403, path


def test_status_never_shows_env_values(tmp_path, runner, controller):
    """Secrets in the job's env do not appear in `runner status`."""
    job = write_job(tmp_path / "s", SLEEPER + "env: {API_KEY: s3cr3t-value}\n")
    job_id = runner.json("submit", str(job))["id"]
    assert "s3cr3t-value" not in runner("status", job_id, "--json").stdout
    assert "s3cr3t-value" not in runner("status", job_id).stdout
