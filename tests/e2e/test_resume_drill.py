"""The resume drill on the local provider: it passes for a job that resumes, and fails for each reason.

The trainee below is an honest training loop unless ``SABOTAGE`` tells it to break its own resume in
one of the ways a real job breaks: it never acknowledges the checkpoint, it cannot find it on restart,
or it restores a different (older) step.
"""

from __future__ import annotations

import pytest

from conftest import Runner, shared_controller, write_job

TRAINEE = r'''
import os, shutil, sys, time
from pathlib import Path
import torch
from runner.checkpoint import Checkpointer

sabotage = os.environ.get("SABOTAGE", "")
second = os.environ["RUNNER_ATTEMPT"] != "1"
if not second:
    time.sleep(float(os.environ.get("LOAD_SECONDS", "0")))  # loading data and weights before the Checkpointer
local = Path(os.environ["RUNNER_CHECKPOINT_DIR"])
durable = Path(os.environ["RUNNER_CHECKPOINT_URL"].removeprefix("file://"))

def committed(root):
    return sorted(p for p in root.glob("step-*") if (p / "manifest.json").exists())

if second and sabotage == "wipe":          # the checkpoint went somewhere the restart does not look
    for root in (local, durable):
        shutil.rmtree(root, ignore_errors=True)
if second and sabotage == "older":         # the newest checkpoint is lost; an older one remains
    for root in (local, durable):
        for folder in committed(root)[-1:]:
            shutil.rmtree(folder)

model = torch.nn.Linear(4, 4)
ckpt = Checkpointer(model=model, interval="1h")
step = ckpt.restore()
print("restored", step, flush=True)
if not second and step == 0:
    ckpt.save(1)                           # an early periodic checkpoint, older than the drill's
    ckpt.wait()
    step = 1                               # trained on from there: the drill's checkpoint is a later step,
                                           # however soon its request comes (a busy machine: during the wait)
while step < 400 and not ckpt.should_stop:
    step += 1
    time.sleep(0.02)
    if sabotage == "deaf" and not second:
        continue                           # never calls step(): the drill's request is never served
    ckpt.step(step)
ckpt.close()
print("done", step, flush=True)
'''

JOB = """
name: drilled
run: python trainee.py
env: {{SABOTAGE: "{sabotage}", LOAD_SECONDS: "{load}"}}
resources: {{cloud: [local]}}
recovery: {{max_failures: 0, resume_drill: {drill}}}
"""


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Runner:
    """One controller for the module's jobs (each test submits its own and reads only it), on the e2e tests' less
    compressed clock (tests/e2e/e2e_fixtures.py): a controller start is a second of CPU."""
    yield from shared_controller(tmp_path_factory, time_scale=0.2)


def _submit(runner, tmp_path, sabotage: str = "", run: str | None = None, load: float = 0, drill: str = "2s") -> str:
    text = JOB.format(sabotage=sabotage, load=load, drill=drill)
    if run:
        text = text.replace("python trainee.py", run)
    path = write_job(tmp_path / "job", text, {"trainee.py": TRAINEE})
    return runner.json("submit", str(path))["id"]


def _end(runner, job_id: str) -> dict:
    return runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=120, what="the end")


def test_a_drill_that_resumes_passes_and_is_its_own_attempt(tmp_path, runner):
    """The drill checkpoints, restarts on the same node, restores that step: passed, and the job goes on."""
    job_id = _submit(runner, tmp_path)
    assert _end(runner, job_id)["state"] == "SUCCEEDED"
    drill, resumed = runner.restarts(job_id)
    assert drill["end_reason"] == "drill" and resumed["end_reason"] == "succeeded"
    assert drill["node"] == resumed["node"]
    assert drill["drill"]["passed"] is True
    assert drill["drill"]["checkpoint_step"] == drill["drill"]["resumed_step"] == drill["checkpoint_step"] > 1
    assert resumed["resumed_from_step"] == drill["checkpoint_step"]
    assert drill["drill"]["seconds"] >= 0


def test_a_job_that_loads_for_longer_than_the_drill_time_still_gets_a_passing_drill(tmp_path, runner):
    """The drill's clock starts when the training process connects, so 12 s of loading before it does not skip it."""
    job_id = _submit(runner, tmp_path, load=12, drill="3s")
    assert _end(runner, job_id)["state"] == "SUCCEEDED"
    drill, resumed = runner.restarts(job_id)
    assert drill["end_reason"] == "drill" and drill["drill"]["passed"] is True, drill
    assert resumed["resumed_from_step"] == drill["drill"]["checkpoint_step"] > 1


@pytest.mark.parametrize("sabotage, reason", [
    ("deaf", "no checkpoint taken"),
    ("wipe", "checkpoint not restorable"),
    ("older", "a different step restored"),
])
def test_a_broken_resume_fails_the_job_naming_what_failed(tmp_path, runner, sabotage, reason):
    """A drill that cannot prove resume fails the job, and the restart log says exactly why."""
    job_id = _submit(runner, tmp_path, sabotage)
    job = _end(runner, job_id)
    assert job["state"] == "FAILED"
    rows = runner.restarts(job_id)
    drilled = next(row for row in rows if row["drill"])
    assert drilled["drill"]["passed"] is False
    assert drilled["drill"]["message"].startswith(reason), drilled["drill"]["message"]
    assert reason in runner("status", job_id).stdout


def test_a_job_without_the_library_gets_a_drill_result_saying_so(tmp_path, runner):
    """A job that never connects to the agent is not failed by the drill; its restart log says why."""
    job_id = _submit(runner, tmp_path, run="python -c \"import time; time.sleep(4); print('plain job done')\"")
    assert _end(runner, job_id)["state"] == "SUCCEEDED"
    (row,) = runner.restarts(job_id)
    assert row["drill"]["passed"] is None
    assert "does not use runner.checkpoint" in row["drill"]["message"]
