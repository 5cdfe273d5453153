"""The ledger end to end: a real job on the local provider, checked against the training script's own clock.

The trainee prints ``time.time()`` just before each ``ckpt.step(step)``. Attempt 1 waits at step 40 for an AWS
notice (an emergency checkpoint at 40); attempt 2 resumes from 40 and fails after step 65, its newest checkpoint
at 60; attempt 3 resumes from 60, so steps 61..65 are trained twice, and finishes at step 100. The restart log's
gaps, the goodput's training and redone seconds follow from the printed times alone (both sides read the same
clock, a few calls apart), whatever the machine's speed.
"""

from __future__ import annotations

import re

import pytest

from e2e_fixtures import home  # noqa: F401 - a less compressed clock for these tests
from conftest import write_job

TOLERANCE = 0.25  # seconds: the print and ckpt.step() are a few calls apart on one clock
TRAIN = """
import os
import sys
import time

import torch
from runner.checkpoint import Checkpointer

attempt = os.environ["RUNNER_ATTEMPT"]
model = torch.nn.Linear(4, 1)
ckpt = Checkpointer(model=model, every_steps=10)
step = ckpt.restore()
while step < 100:
    time.sleep(0.02)
    step += 1
    print(f"step {step} at {time.time():.6f}", flush=True)
    ckpt.step(step)
    if step == 40 and attempt == "1":
        print("waiting for the preemption", flush=True)
        while not ckpt.should_stop:  # the same step again: the notice's emergency checkpoint is taken here
            time.sleep(0.05)
            ckpt.step(step)
    if step == 65 and attempt == "2":
        ckpt.close()  # step 60's checkpoint is committed; 61..65 will be trained again
        sys.exit("failing after step 65")
    if ckpt.should_stop:
        break
ckpt.close()
"""
JOB = """
name: ledger
setup: sleep 0.5
run: python train.py
resources: {cloud: [local]}
recovery: {max_preemptions: 2, max_failures: 1, resume_drill: "off", prepare_on: []}  # each relaunch on a fresh node, as this ledger test measures it (a prepared replacement is tested in test_train_through_notice.py)
"""
STEP = re.compile(r"^step (\d+) at (\d+\.\d+)$", re.M)


def _step_times(runner, job_id: str, attempt: int) -> dict[int, float]:
    """The times the script printed for each step of one attempt."""
    output = runner.output(job_id, attempt)
    return {int(step): float(at) for step, at in STEP.findall(output)}


def test_gaps_and_goodput_match_the_training_scripts_own_clock(tmp_path, runner, controller):
    job_id = runner.json("submit", str(write_job(tmp_path / "job", JOB, {"train.py": TRAIN})))["id"]
    runner.wait_for_output(job_id, r"^waiting for the preemption$", timeout=180)
    assert runner("preempt", job_id).returncode == 0
    job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=300, what="the end")
    assert job["state"] == "SUCCEEDED" and job["step"] == 100

    rows = runner.restarts(job_id)
    assert [(r["end_reason"], r["resumed_from_step"]) for r in rows] == [
        ("preempted", 0), ("failed", 40), ("succeeded", 60)]
    one, two, three = (_step_times(runner, job_id, attempt) for attempt in (1, 2, 3))
    assert (min(one), max(one), min(two), max(two), min(three), max(three)) == (1, 40, 41, 65, 61, 100)

    # The gap: from the last step of the attempt before to the first step of this one, as the script saw them.
    assert rows[0]["gap_seconds"] is None
    assert rows[1]["gap_seconds"] == pytest.approx(two[41] - one[40], abs=TOLERANCE)
    assert rows[2]["gap_seconds"] == pytest.approx(three[61] - two[65], abs=TOLERANCE)

    # Each attempt's start on its fresh node: the boot, the 0.5 s setup, then the restore; all inside the gap.
    for row in rows:
        assert row["boot_seconds"] >= 0 and row["setup_seconds"] >= 0.5
    for row in rows[1:]:
        assert row["restore_seconds"] >= 0
        assert row["gap_seconds"] >= row["boot_seconds"] + row["setup_seconds"] + row["restore_seconds"]

    # Goodput: kept steps at each attempt's own pace; steps 61..65 of attempt 2 were trained again by attempt 3.
    per_step_two = (two[65] - two[41]) / (65 - 41)
    kept = (one[40] - one[1]) + (60 - 41) * per_step_two + (three[100] - three[61])
    goodput = job["goodput"]
    assert goodput["redone_seconds"] == pytest.approx((65 - 60) * per_step_two, abs=TOLERANCE)
    assert goodput["training_seconds"] == pytest.approx(kept, abs=3 * TOLERANCE)
    assert goodput["paid_seconds"] >= goodput["training_seconds"] + goodput["redone_seconds"]
    assert goodput["ratio"] == pytest.approx(goodput["training_seconds"] / goodput["paid_seconds"], abs=1e-3)
    assert "goodput:" in runner("status", job_id).stdout
