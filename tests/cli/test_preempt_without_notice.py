"""`runner preempt JOB --notice none`: the node vanishes without a notice, every process of it killed at once (the
job's own children too, wherever they went), and the controller finds it gone and ends the attempt ``lost``."""

from __future__ import annotations

import time

from conftest import controller_with_a_sleeping_job, write_job

SPAWNER = """
name: spawner
run: (setsid sleep 600 & echo $! > {pidfile}; wait)
resources: {{cloud: [local]}}
recovery: {{resume_drill: "off"}}
"""


def _alive(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_a_vanished_node_takes_its_processes_with_it_and_its_attempt_ends_lost(tmp_path):
    with controller_with_a_sleeping_job(tmp_path) as running:
        runner = running.runner
        pidfile = tmp_path / "child.pid"
        job_id = runner.json("submit", str(write_job(tmp_path / "spawner", SPAWNER.format(pidfile=pidfile))))["id"]
        runner.wait_for(job_id, lambda j: j["state"] == "RUNNING", what="running")
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pidfile.read_text())  # a process of the job in a session of its own, as torchrun's workers are
        assert _alive(child)
        result = runner("preempt", job_id, "--notice", "none")
        assert result.returncode == 0, result.stderr
        assert "vanished without a notice" in result.stdout
        assert not _alive(child)
        job = runner.wait_for(job_id, lambda j: j["attempts"] >= 2, timeout=60, what="the relaunch")
        first = runner.json("restarts", job_id)[0]
        assert first["end_reason"] == "lost" and first["notice"] is None and job["preemptions"] == 1
        runner("cancel", job_id)


def test_no_notice_takes_no_false_notice_flag(tmp_path):
    with controller_with_a_sleeping_job(tmp_path) as running:
        result = running.runner("preempt", running.job_id, "--notice", "none", "--no-reclaim")
        assert result.returncode == 2 and "--notice none sends no notice" in result.stderr
