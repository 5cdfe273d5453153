"""A job process ended by a signal (the kernel's out-of-memory killer sends SIGKILL) is named as such in the
restart log and in `runner status`, with what to check: the bare exit code 137 says neither. It is relaunched as
any failure is (another node may have the memory), within recovery.max_failures."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from conftest import Runner, shared_controller, write_job

JOB = """
name: {name}
run: {run}
resources: {{cloud: [local]}}
recovery: {{max_failures: {max_failures}, resume_drill: "off"}}
"""
KILLS_ITSELF = f"{sys.executable} -c 'import os, signal; print(\"allocating\", flush=True); os.kill(os.getpid(), signal.{{sig}})'"



@pytest.fixture(scope="module")
def market(tmp_path_factory) -> Iterator[Runner]:
    """A controller the tests share: each reads only the jobs it submitted."""
    yield from shared_controller(tmp_path_factory, time_scale=0.05)


def test_a_process_killed_by_sigkill_is_named_with_the_memory_to_check(market, tmp_path):
    run = KILLS_ITSELF.format(sig="SIGKILL")
    once = market.json("submit", str(write_job(tmp_path / "a", JOB.format(name="oom-killed", run=run,
                                                                          max_failures=1))))["id"]
    job = market.wait_for(once, lambda j: j["state"] in ("FAILED", "SUCCEEDED"), timeout=180, what="the end")
    assert job["state"] == "FAILED" and job["attempts"] == 2 and job["failures"] == 2, job  # relaunched once
    rows = market.json("restarts", once)
    for row in rows:
        assert row["exit_code"] == 137 and "killed by SIGKILL" in row["message"], row
        assert "out of memory" in row["message"] and "resources.memory_gb" in row["message"], row
    assert "killed by SIGKILL" in job["failure"] and f"runner logs {once}" in job["failure"]
    status = market("status", once)
    assert status.returncode == 0 and "killed by SIGKILL" in status.stdout


def test_a_process_ended_by_another_signal_names_it(market, tmp_path):
    run = KILLS_ITSELF.format(sig="SIGSEGV")
    job_id = market.json("submit", str(write_job(tmp_path / "b", JOB.format(name="segfault", run=run,
                                                                            max_failures=0))))["id"]
    job = market.wait_for(job_id, lambda j: j["state"] in ("FAILED", "SUCCEEDED"), timeout=180, what="the end")
    (row,) = market.json("restarts", job_id)
    assert row["exit_code"] == 139 and "killed by SIGSEGV" in row["message"], row
    assert "memory_gb" not in row["message"]
    assert "killed by SIGSEGV" in job["failure"]
