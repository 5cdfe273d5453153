"""A training process whose agent is gone ends: SIGKILL the agent of a node running torchrun with two workers
(each in a session of its own, as torchrun starts them, under a shell that runs torchrun as its child) and every
process of that attempt ends by itself, with no agent, node power-off or controller to end it. The workers
write their output to files (torchrun --redirects), as many jobs do: a worker that prints to the dead agent's
pipe dies anyway, of the broken pipe."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from e2e_fixtures import home  # noqa: F401 - a less compressed clock for these tests
from conftest import REPO, write_job
from job_processes import agent_pid, attempt_processes, wait_until_gone

TRAIN = REPO / "examples" / "multinode" / "train.py"
JOB = """
name: orphaned
run: torchrun --standalone --nproc-per-node=2 --log-dir torchrun-logs --redirects 3 train.py --steps 1000000 --step-time 0.05 --log-every 1000000 --interval 1h; echo "torchrun ended"
resources: {cloud: [local]}
recovery: {max_preemptions: 0, max_failures: 0, resume_drill: "off"}
"""
# Ample: a job ends within the agent-loss grace (30 s) after the agent's death; this machine may be slow.
GONE_TIMEOUT_SECONDS = 180.0

pytestmark = pytest.mark.timeout(900)  # torch on several ranks, on a busy machine


def _wait_for_workers(home: Path, timeout: float = 240) -> None:
    """Until both workers have said they train, in their torchrun log files on the node."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = [p.read_text() for p in home.glob("nodes/*/scratch/work/torchrun-logs/**/stdout.log")]
        if sum("starting fresh" in text for text in said) == 2:
            return
        time.sleep(0.5)
    raise AssertionError("the workers never started training")


def test_every_process_of_the_attempt_ends_when_its_agent_is_sigkilled(runner, controller, tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(TRAIN, folder / "train.py")
    job_id = runner.json("submit", str(write_job(folder, JOB)))["id"]
    _wait_for_workers(controller.home)
    assert len(attempt_processes(job_id, 1)) >= 4  # bash, torchrun, its two workers
    node = runner.json("status", job_id)["current_attempt"]["node"]
    os.kill(agent_pid(controller.home, node), signal.SIGKILL)
    left = wait_until_gone(job_id, 1, GONE_TIMEOUT_SECONDS)
    assert left == [], f"processes of the attempt still alive {GONE_TIMEOUT_SECONDS:.0f} s after its agent died"
