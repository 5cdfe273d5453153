"""Cancel, lost nodes and a controller killed mid-job."""

from __future__ import annotations

import os
import re
import time

import pytest

from conftest import Controller, write_job

LONG_JOB = """
name: long
run: python -c "import os, time; print('pid', os.getpid(), flush=True); time.sleep(600)"
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""


def _pid_from_logs(runner, job_id: str) -> int:
    output = runner.wait_for_output(job_id, r"^pid \d+", timeout=60)
    return int(re.search(r"^pid (\d+)", output, re.M).group(1))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cancel_kills_the_process_group_and_releases_the_node(tmp_path, runner, controller, home):
    """`cancel` stops the running job's processes, ends it CANCELLED and deletes the node's scratch."""
    job_id = runner.json("submit", str(write_job(tmp_path / "job", LONG_JOB)))["id"]
    pid = _pid_from_logs(runner, job_id)
    assert runner("cancel", job_id).returncode == 0
    runner.wait_for(job_id, lambda j: j["state"] == "CANCELLED", what="cancel")
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
    (row,) = runner.json("restarts", job_id)
    assert row["end_reason"] == "cancelled"
    time.sleep(1)
    assert not any(home.glob("nodes/*/scratch"))


def test_lost_node_is_relaunched_with_end_reason_lost(tmp_path, runner, controller, home):
    """A node that vanishes without a notice ends its attempt as lost and the job gets a new node."""
    from runner.providers.local.processes import kill_session

    job_id = runner.json("submit", str(write_job(tmp_path / "job", LONG_JOB)))["id"]
    _pid_from_logs(runner, job_id)
    (ref_file,) = home.glob("nodes/*/ref")
    kill_session(int(ref_file.read_text().split(":")[0]))
    job = runner.wait_for(job_id, lambda j: j["attempts"] == 2 and j["state"] == "RUNNING", what="relaunch")
    rows = runner.json("restarts", job_id)
    assert rows[0]["end_reason"] == "lost" and rows[1]["end_reason"] == "running"
    assert job["preemptions"] == 1


@pytest.mark.on_both_databases  # the output buffered meanwhile is resent; on Postgres it is stored in the database
def test_controller_killed_mid_job_loses_and_duplicates_nothing(tmp_path, runner, controller, home):
    """SIGKILL of the controller during a running job: after a restart the same attempt finishes, once."""
    job = write_job(tmp_path / "job", """
name: survive
run: for i in $(seq 1 20); do echo "tick $i"; sleep 0.25; done
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
""")
    job_id = runner.json("submit", str(job))["id"]
    runner.wait_for(job_id, lambda j: j["state"] == "RUNNING", what="running")
    controller.kill()
    time.sleep(1.5)  # the job keeps running and buffering output while the controller is down
    port = int(controller.url.rsplit(":", 1)[1])
    restarted = Controller(home, db_url=controller.db_url).start(port)  # nodes know the controller by its URL
    runner.env.update({"RUNNER_SERVER": restarted.url})
    try:
        runner.wait_for(job_id, lambda j: j["state"] == "SUCCEEDED", timeout=90, what="success")
        rows = runner.json("restarts", job_id)
        assert len(rows) == 1 and rows[0]["end_reason"] == "succeeded"
        logs = runner("logs", job_id).stdout
        assert all(logs.count(f"tick {i}\n") == 1 for i in range(1, 21))
        assert len(list(home.glob("nodes/*"))) == 1
    finally:
        restarted.stop()


def test_controller_down_exits_3_and_says_how_to_start_it(tmp_path, runner):
    """With RUNNER_SERVER pointing at nothing, commands exit 3 and name the fix."""
    result = runner("jobs", env={"RUNNER_SERVER": "http://127.0.0.1:9", "RUNNER_TOKEN": "x"})
    assert result.returncode == 3
    assert "runner server" in result.stderr and "Traceback" not in result.stderr


def test_controller_down_exits_3_without_a_token_too(runner):
    """RUNNER_SERVER naming a controller that does not answer is exit 3 even when no token is set anywhere."""
    result = runner("jobs", env={"RUNNER_SERVER": "http://127.0.0.1:9"})
    assert result.returncode == 3, result.stderr
    assert "cannot reach the controller" in result.stderr and "Traceback" not in result.stderr


def test_a_controller_that_answers_without_a_token_is_named_with_the_fix(tmp_path, runner, controller):
    """RUNNER_SERVER naming a live controller, and no token in RUNNER_TOKEN or this RUNNER_HOME: exit 1 naming
    RUNNER_TOKEN."""
    other_home = tmp_path / "elsewhere"
    other_home.mkdir()
    result = runner("jobs", env={"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": "", "RUNNER_HOME": str(other_home)})
    assert result.returncode == 1 and "set RUNNER_TOKEN" in result.stderr, result.stderr
