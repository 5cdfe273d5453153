"""A command whose output's reader has gone (`runner jobs --json | head -1`) ends as other Unix tools do: nothing on
stderr (no traceback), exit status 141; `runner logs JOB --follow | head -1` ends once head has, though the job
prints nothing. The real CLI, a real pipe, a real controller on the local market."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import Runner, shared_controller, write_job

SILENT = """
name: silent
run: sleep 600
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""

# How long a command whose reader has gone may take to end: a command that waits for the job (600 s) runs past it.
END_WITHIN_S = 60


@pytest.fixture(scope="module")
def market(tmp_path_factory) -> Runner:
    yield from shared_controller(tmp_path_factory, time_scale=0.05)


@pytest.fixture(scope="module")
def job_id(market, tmp_path_factory) -> str:
    """A running job that prints nothing: `runner logs JOB` prints its attempt's separator line, then waits."""
    job = market.json("submit", str(write_job(tmp_path_factory.mktemp("job"), SILENT)))["id"]
    market.wait_for(job, lambda j: j["state"] == "RUNNING", what="running")
    return job


def _command(market: Runner, *args: str) -> tuple[list[str], dict]:
    """The CLI as a person's shell runs it: its stdout buffered as Python buffers a pipe's."""
    env = {k: v for k, v in market.env.items() if k != "PYTHONUNBUFFERED"}
    return [sys.executable, "-m", "runner.cli.main", *args], env


@pytest.mark.parametrize("args", [("jobs",), ("jobs", "--json"), ("status", "JOB"), ("status", "JOB", "--json"),
                                  ("restarts", "JOB"), ("restarts", "JOB", "--json"), ("logs", "JOB")])
def test_a_command_whose_reader_has_gone_exits_141_saying_nothing(market, job_id, args):
    """The pipe's reading end is closed before the command writes (head ended early): exit 141, stderr empty."""
    command, env = _command(market, *(job_id if a == "JOB" else a for a in args))
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(command, stdout=write, stderr=subprocess.PIPE, text=True, env=env, cwd=market.home,
                                timeout=END_WITHIN_S)
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (141, "")


def test_logs_follow_into_head_ends_once_head_has(market, job_id):
    """`runner logs JOB --follow | head -1`: head prints the attempt's separator and exits; the job prints nothing for
    minutes, and the command ends all the same (it waited for the job's first line or its end, writing nothing)."""
    command, env = _command(market, "logs", job_id, "--follow")
    follow = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=market.home)
    head = subprocess.run(["head", "-1"], stdin=follow.stdout, capture_output=True, text=True, timeout=END_WITHIN_S)
    follow.stdout.close()  # head held the only other reading end
    try:
        code = follow.wait(END_WITHIN_S)
    except subprocess.TimeoutExpired:
        follow.kill()
        follow.wait()
        code = None
    stderr = follow.stderr.read()
    follow.stderr.close()
    assert head.stdout.startswith("===== attempt 1")
    assert (code, stderr) == (141, "")
