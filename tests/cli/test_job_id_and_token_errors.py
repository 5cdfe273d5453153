"""A command given a job id that names no job, or a token the controller refuses, exits 1 with one plain line that
names the cause and the fix, for every command that takes a job id (the real CLI against a real controller)."""

from __future__ import annotations

import pytest
import yaml

from conftest import Runner, shared_controller, write_job

SLEEPER = """
name: sleeper
run: sleep 600
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""

COMMANDS = [("status",), ("logs",), ("logs", "--follow"), ("restarts",), ("cancel",), ("preempt",)]


@pytest.fixture(scope="module")
def market(tmp_path_factory) -> Runner:
    yield from shared_controller(tmp_path_factory, time_scale=0.05)


@pytest.fixture(scope="module")
def job_id(market, tmp_path_factory) -> str:
    job = market.json("submit", str(write_job(tmp_path_factory.mktemp("job"), SLEEPER)))["id"]
    market.wait_for(job, lambda j: j["state"] == "RUNNING", what="running")
    return job


def _one_plain_line(stderr: str) -> str:
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    return stderr


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("odd", [".", "a/b", ""])
def test_an_id_that_is_no_job_id_is_named_as_no_job(market, command, odd):
    """`.`, `a/b`, an empty id: "no job", what a job id is and where the ids are listed (they got "Not Found", "405
    Method Not Allowed", a TypeError from the job listing read as a job, or "no job 'restarts'")."""
    result = market(command[0], odd, *command[1:])
    assert result.returncode == 1, result.stdout
    assert f"error: no job {odd!r}: a job id is letters, digits and '-'" in _one_plain_line(result.stderr)
    assert "`runner jobs` lists the jobs" in result.stderr


def test_an_id_with_a_path_in_it_does_not_reach_another_job(market, job_id):
    """`x/../JOB` is no job id: it is refused, not resolved to JOB (whose status it printed)."""
    result = market("status", f"x/../{job_id}")
    assert result.returncode == 1 and job_id not in result.stdout
    assert "no job" in _one_plain_line(result.stderr)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_job_that_does_not_exist_is_named_with_where_the_jobs_are_listed(market, command):
    result = market(command[0], "nope-0123456789", *command[1:])
    assert result.returncode == 1
    assert "no job 'nope-0123456789'; `runner jobs` lists the jobs" in _one_plain_line(result.stderr)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_refused_token_names_where_it_came_from_and_the_admin_token(market, job_id, command):
    """(It said "check RUNNER_TOKEN" without saying which token the controller wants.)"""
    result = market(command[0], job_id, *command[1:], env={"RUNNER_TOKEN": "not-the-token"})
    assert result.returncode == 1
    assert ("the controller refused the token from RUNNER_TOKEN (invalid token); set RUNNER_TOKEN to that "
            "controller's admin token (the admin-token file in its data dir)") in _one_plain_line(result.stderr)


def test_a_refused_token_from_config_yaml_names_that_file(market, job_id, tmp_path):
    """RUNNER_TOKEN unset, config.yaml's `token:` refused: the message names config.yaml, where the token came from
    (it said "check RUNNER_TOKEN", which was not set)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"server": market.env["RUNNER_SERVER"], "token": "stale"}))
    env = {k: v for k, v in market.env.items() if k not in ("RUNNER_SERVER", "RUNNER_TOKEN")}
    cli = Runner(home)
    cli.env = {**env, "RUNNER_HOME": str(home)}
    result = cli("status", job_id)
    assert result.returncode == 1
    assert f"refused the token from {home / 'config.yaml'}: token (invalid token)" in _one_plain_line(result.stderr)


def test_a_node_token_given_to_the_cli_says_the_admin_token_is_needed(market, job_id):
    """A node's token (from its agent.yaml) where the admin token belongs: cancel is not allowed, and the message says
    which token it needs (it said only "not allowed: a node token cannot do this")."""
    status = market.json("status", job_id)
    node = status["current_attempt"]["node"]
    token = next(yaml.safe_load(c.read_text())["token"] for c in market.home.glob("nodes/*/agent.yaml")
                 if yaml.safe_load(c.read_text())["node_id"] == node)
    result = market("cancel", job_id, env={"RUNNER_TOKEN": token})
    assert result.returncode == 1
    assert ("not allowed: a node token cannot do this; the token from RUNNER_TOKEN is a node's: set RUNNER_TOKEN to "
            "the controller's admin token") in _one_plain_line(result.stderr)
    assert market.job(job_id)["state"] == "RUNNING"
