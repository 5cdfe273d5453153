"""A 2-node x 2-rank gang (torchrun, gloo, CPU) with one rank hung, then a notice to its node.

Rank 3 (node 1) stops making progress after step 35 of the first attempt, outside step(), ignoring SIGTERM;
the other three wait for it at the next step's agreement. Then node 1 gets an AWS notice. No emergency
checkpoint can be taken, but the stop is bounded by the notice's deadline: the attempt ends preempted with
the last committed checkpoint (step 30), its restart-log message names rank 3 as the rank that never
reached the stop step, every process of the attempt on either node is gone by the time the next attempt
trains (torchrun's workers lead sessions of their own), and the next attempt resumes from step 30."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from conftest import kill_nodes, write_job
from job_processes import attempt_processes, wait_until_gone

SCRIPT = Path(__file__).with_name("hung_rank_train.py")
JOB = """
name: hung
run: >-
  torchrun --nnodes=$RUNNER_NUM_NODES --node-rank=$RUNNER_NODE_RANK --nproc-per-node=2
  --master-addr=$RUNNER_MASTER_ADDR --master-port=$RUNNER_MASTER_PORT train.py 60 3 35
resources: {cloud: [local], num_nodes: 2}
recovery: {max_preemptions: 3, max_failures: 0, resume_drill: "off"}
"""

pytestmark = pytest.mark.timeout(900)  # torch on four ranks and two attempts, on a busy machine


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The local market's clock at 0.1, not the other e2e tests' 0.2: the hung attempt lasts until the AWS notice's
    deadline, and a 12 s notice bounds the stop as a 24 s one does (still long enough to train through)."""
    path = tmp_path / "home"
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.1}}}))
    yield path
    kill_nodes(path)


def test_a_hung_rank_ends_the_attempt_by_the_deadline_naming_it_and_leaving_no_process(runner, controller,
                                                                                        tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(SCRIPT, folder / "train.py")
    job_id = runner.json("submit", str(write_job(folder, JOB)))["id"]
    try:
        runner.wait_for_output(job_id, "rank 3: hanging after step 35", timeout=600, node=1)
        assert runner("preempt", job_id, "--node", "1", "--notice", "aws").returncode == 0
        runner.wait_for_output(job_id, "rank 0: resumed from step", timeout=600, attempt=2)
        assert attempt_processes(job_id, 1) == []  # gone, on both nodes, before the next attempt trains
        job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=600, what="the end")
        first = runner.restarts(job_id)[0]
        assert first["end_reason"] == "preempted", first
        assert first["checkpoint_step"] == 30, first
        assert "rank 3 never reached the stop step (its last step was 34" in (first.get("message") or ""), first
        assert job["state"] == "SUCCEEDED", job
        second = runner.restarts(job_id)[1]
        assert second["resumed_from_step"] == 30, second
    finally:  # a failing test leaves nothing behind
        for attempt in (1, 2):
            wait_until_gone(job_id, attempt, timeout=0)

