"""`runner cancel` on the local provider: the job gets its checkpoint, SIGTERM and the grace before its node goes."""

from __future__ import annotations

import re

from e2e_fixtures import home  # noqa: F401 - a less compressed clock for these tests
from conftest import write_job

WIND_DOWN = r'''
import signal, sys, time

def wind_down(*_):
    print("SIGTERM: saving and winding down", flush=True)
    time.sleep(4)
    print("last line", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, wind_down)
print("ready", flush=True)
while True:
    time.sleep(0.1)
'''

TRAINEE = r'''
import time

import torch
from runner.checkpoint import Checkpointer

model = torch.nn.Linear(4, 4)
ckpt = Checkpointer(model=model, interval="1h")
step = ckpt.restore()
while not ckpt.should_stop:
    step += 1
    time.sleep(0.02)
    ckpt.step(step)
    if step == 5:
        print("training", flush=True)
ckpt.close()
print("stopped at step", step, flush=True)
'''

JOB = """
name: cancelled
run: python {script}
resources: {{cloud: [local]}}
recovery: {{resume_drill: "off"}}
"""


def _submit(runner, tmp_path, script: str, text: str) -> str:
    path = write_job(tmp_path / "job", JOB.format(script=script), {script: text})
    return runner.json("submit", str(path))["id"]


def _cancel_and_wait(runner, job_id: str) -> dict:
    assert runner("cancel", job_id).returncode == 0
    return runner.wait_for(job_id, lambda j: j["state"] == "CANCELLED", timeout=60, what="cancelled")


def test_a_job_that_traps_sigterm_winds_down_before_its_node_goes(tmp_path, runner, controller):
    """A cancelled job that needs 4 s after SIGTERM to save and wind down prints its last line."""
    job_id = _submit(runner, tmp_path, "wind_down.py", WIND_DOWN)
    runner.wait_for_output(job_id, "ready", timeout=120)
    _cancel_and_wait(runner, job_id)
    output = runner.output(job_id)
    assert "SIGTERM: saving and winding down" in output and "last line" in output, output
    (row,) = runner.restarts(job_id)
    assert row["end_reason"] == "cancelled" and row["exit_code"] == 0


def test_a_checkpointer_job_cancelled_mid_run_has_its_step_committed(tmp_path, runner, controller):
    """A cancel asks the library for a stop checkpoint: the step the job stopped at is the job's committed step."""
    job_id = _submit(runner, tmp_path, "train.py", TRAINEE)
    runner.wait_for_output(job_id, "training", timeout=120)
    job = _cancel_and_wait(runner, job_id)
    output = runner.output(job_id)
    match = re.search(r"stopped at step (\d+)", output)
    assert match, f"the job was killed before it could stop by itself: {output}"
    stopped = int(match.group(1))
    assert stopped >= 5
    assert job["step"] == stopped
