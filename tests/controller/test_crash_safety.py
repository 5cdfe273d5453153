"""The controller can be killed at any moment without losing or duplicating a job, attempt or node."""

from __future__ import annotations

import random
import time

from conftest import Controller, write_job

SQLITE_ONLY = ("one controller SIGKILLed at random moments with real nodes; on Postgres the leader is SIGKILLed "
               "mid-launch, mid-transition and mid-recovery in test_failover.py")

JOB = """
name: steady-{n}
run: sleep 1.5; echo "done $RUNNER_JOB_ID attempt $RUNNER_ATTEMPT"
resources: {{cloud: [local]}}
recovery: {{resume_drill: "off"}}
"""


def test_sigkill_at_random_moments_leaves_one_attempt_and_one_node_per_job(tmp_path, runner, controller, home):
    """Jobs submitted while the controller is SIGKILLed and restarted repeatedly each run exactly once."""
    port = int(controller.url.rsplit(":", 1)[1])
    rng = random.Random(20261121)
    job_ids = [runner.json("submit", str(write_job(tmp_path / str(n), JOB.format(n=n))))["id"] for n in range(3)]
    current = controller
    for _ in range(4):
        time.sleep(rng.uniform(0.05, 1.0))
        current.kill()
        current = Controller(home, db_url=controller.db_url).start(port)
    try:
        for job_id in job_ids:
            runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=120, what="the end")
        for job_id in job_ids:
            rows = runner.json("restarts", job_id)
            assert [r["end_reason"] for r in rows] == ["succeeded"], rows
            assert runner("logs", job_id).stdout.count(f"done {job_id} attempt 1") == 1
        assert len(list(home.glob("nodes/*/ref"))) == len(job_ids)
    finally:
        current.stop()
