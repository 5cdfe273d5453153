"""After a notice, the next attempt starts as soon as the emergency checkpoint is durable.

The old training process still has to exit (``close()``, teardown, its last lines); nothing of the next
attempt depends on that, so the controller ends the attempt at the agent's handover and launches the
replacement at once. The old node drains: it keeps running until its process exits and its output is
shipped, then it is released. Here the old process does not exit until the replacement node exists (the
local provider made its folder), which it would never see if the launch waited for its exit (the agent
stops it 10 s after its acknowledgement: its last line would then be missing).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml

from conftest import kill_nodes, write_job

TRAINEE = """
import os, pathlib, time
import torch
from runner.checkpoint import Checkpointer

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = Checkpointer(model=model, optimizer=optimizer, interval="1h")
step = ckpt.restore()
print(f"resumed from step {step}" if step else "starting fresh", flush=True)
while step < 120 or os.environ["RUNNER_ATTEMPT"] == "1":  # the first attempt trains until its notice
    optimizer.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    optimizer.step()
    step += 1
    print(f"step {step}", flush=True)
    ckpt.step(step)
    if ckpt.should_stop:
        print(f"stopped at step {step}; waiting for the next node", flush=True)
        nodes = pathlib.Path(os.environ["NODES_DIR"])
        while len(list(nodes.iterdir())) < 2:  # killed by the agent if it never comes
            time.sleep(0.02)
        print("last words of the old attempt", flush=True)
        break
    time.sleep(0.05)
ckpt.close()
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A real-time clock (time scale 1): the old node's notice leaves it AWS's full 120 s, far more than the
    test needs, so the node is never reclaimed before the test lets its process exit."""
    path = tmp_path / "home"
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 1.0}}}))
    yield path
    kill_nodes(path)


def _wait(predicate, what: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_next_attempt_launches_while_the_old_process_is_still_exiting(tmp_path, home, runner, controller):
    job = (f"name: handover\nrun: python train.py\nenv: {{NODES_DIR: '{home / 'nodes'}'}}\n"
           "resources: {cloud: [local]}\ncheckpoint: {interval: 1h}\n"
           "recovery: {max_preemptions: 2, max_failures: 0, resume_drill: 'off'}\n")
    job_id = runner.json("submit", str(write_job(tmp_path / "job", job, {"train.py": TRAINEE})))["id"]
    runner.wait_for_output(job_id, r"^step 5$", timeout=180)
    assert runner("preempt", job_id, "--notice", "aws").returncode == 0

    job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=240, what="the end")
    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1 and job["attempts"] == 2
    old_logs = runner.output(job_id, 1)
    step = int(re.search(r"stopped at step (\d+)", old_logs).group(1))
    # The old process saw the replacement node before it exited, and its last line still reached the logs.
    assert "last words of the old attempt" in old_logs
    first = _wait(lambda: (row := runner.restarts(job_id)[0])["exit_code"] is not None and row,
                  "the old node's exit report")
    second = runner.restarts(job_id)[1]
    assert first["end_reason"] == "preempted" and first["checkpoint_step"] == step and first["lost_seconds"] == 0.0
    assert first["exit_code"] == 0  # it exited by itself: the agent did not have to stop it
    assert second["resumed_from_step"] == step and second["end_reason"] == "succeeded"
    assert f"resumed from step {step}" in runner.output(job_id, 2)
