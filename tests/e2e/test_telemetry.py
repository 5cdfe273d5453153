"""Job telemetry end to end (docs/restart-log.md): a real job on the local provider, preempted once, reports its figures.

The trainee passes known NaN losses to ``ckpt.step(step, loss=...)``; after a preemption each attempt's row
of the restart log has the steps it trained and the NaN steps among them, status has steps/s, the cost per
1,000 kept steps and the manifest (with the commit `runner submit` recorded), and a job that reports no loss
has nan_steps null.
"""

from __future__ import annotations

import math
import platform
import re
import subprocess

import torch

from e2e_fixtures import home  # noqa: F401 - a less compressed clock for these tests
from conftest import write_job

STEPS = 120
NAN_AT = (5, 17, 33, 90, 100, 111)
PAUSE_AT = 40  # the first attempt waits here for its preemption: a known step, whatever the machine's speed
TRAIN = f"""
import os
import sys
import time

import torch
from runner.checkpoint import Checkpointer

model = torch.nn.Linear(4, 1)
ckpt = Checkpointer(model=model, every_steps=10)
step = ckpt.restore()
with_loss = "--no-loss" not in sys.argv
while step < {STEPS}:
    time.sleep(0.02)
    step += 1
    loss = torch.tensor(float("nan") if step in {NAN_AT} else 1.0 / step)
    ckpt.step(step, loss=loss if with_loss else None)
    print(f"step {{step}}", flush=True)
    if step == {PAUSE_AT} and with_loss and os.environ["RUNNER_ATTEMPT"] == "1":
        print("waiting for the preemption", flush=True)
        while not ckpt.should_stop:  # the same step again: the notice's emergency checkpoint is taken here
            time.sleep(0.05)
            ckpt.step(step)
    if ckpt.should_stop:
        print(f"stopped at step {{step}}", flush=True)
        break
ckpt.close()
"""
JOB = """
name: {name}
run: python train.py {args}
resources: {{cloud: [local]}}
recovery: {{max_preemptions: 2, max_failures: 0, resume_drill: "off"}}
"""


def _committed_repo(folder, name: str, args: str) -> str:
    """The job's folder as a git repository with everything committed; its HEAD."""
    write_job(folder, JOB.format(name=name, args=args), {"train.py": TRAIN})
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(folder)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the job"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def test_steps_nan_steps_peak_memory_cost_per_1000_steps_and_the_manifest(tmp_path, runner, controller):
    """Preempted once: each attempt's steps and NaN steps, steps/s > 0, $/1000 steps, the manifest; no loss: null."""
    head = _committed_repo(tmp_path / "with-loss", "with-loss", "")
    _committed_repo(tmp_path / "no-loss", "no-loss", "--no-loss")
    job_id = runner.json("submit", str(tmp_path / "with-loss" / "job.yaml"))["id"]
    quiet_id = runner.json("submit", str(tmp_path / "no-loss" / "job.yaml"))["id"]
    runner.wait_for_output(job_id, r"^waiting for the preemption$")
    assert runner("preempt", job_id).returncode == 0

    job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=180, what="the end")
    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1 and job["step"] == STEPS
    stopped = PAUSE_AT
    assert re.search(rf"^stopped at step {stopped}$", runner.output(job_id), re.M)

    first, second = runner.restarts(job_id)
    assert (first["end_reason"], second["resumed_from_step"]) == ("preempted", stopped)
    assert (first["steps"], second["steps"]) == (stopped, STEPS - stopped)
    assert first["nan_steps"] == sum(s <= stopped for s in NAN_AT)
    assert second["nan_steps"] == sum(s > stopped for s in NAN_AT)
    assert all(0 < row["peak_memory_gb"] < 64 for row in (first, second))  # a CPU node: the trainee's peak RSS

    assert job["steps_per_second"] > 0
    assert math.isclose(job["cost_per_1000_steps"], job["cost_usd"] / STEPS * 1000, rel_tol=1e-3, abs_tol=1e-6)
    listed = next(j for j in runner.json("jobs") if j["id"] == job_id)
    assert listed["steps_per_second"] == job["steps_per_second"]
    assert listed["cost_per_1000_steps"] == job["cost_per_1000_steps"]
    manifest = job["manifest"]
    assert (manifest["git_commit"], manifest["git_dirty"]) == (head, False)
    assert (manifest["python"], manifest["torch"], manifest["argv"]) == (
        platform.python_version(), torch.__version__, ["train.py"])
    assert re.fullmatch(r"[0-9a-f]{64}", manifest["packages_sha256"]) and manifest["gpus"] == []

    quiet = runner.wait_for(quiet_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=180, what="the end")
    assert quiet["state"] == "SUCCEEDED"
    (row,) = runner.restarts(quiet_id)
    assert (row["steps"], row["nan_steps"]) == (STEPS, None) and row["peak_memory_gb"] > 0
    assert quiet["manifest"]["argv"] == ["train.py", "--no-loss"]
