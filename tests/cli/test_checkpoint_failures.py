"""A checkpoint that fails to save is reported: `runner status` names the last failure and its tier."""

from __future__ import annotations

from conftest import write_job

JOB = """
name: bad-disk
run: python train.py
resources: {cloud: [local]}
recovery: {resume_drill: "off"}
"""
# The local tier is a path under a regular file: every local write fails, the durable tier still gets it.
TRAIN = """
import pathlib, torch
from runner.checkpoint import Checkpointer
pathlib.Path("blocker").write_text("a file where a folder should be")
model = torch.nn.Linear(2, 2)
ckpt = Checkpointer(model=model, local_dir="blocker/ckpt")
ckpt.restore()
ckpt.save(1)
ckpt.wait()
ckpt.close()
assert Checkpointer(model=model, local_dir="fresh").restore() == 1, "the durable tier should have it"
"""


def test_a_failed_local_save_is_shown_in_status(tmp_path, runner, controller):
    """The job succeeds from the durable copy, and status says the local tier failed at step 1."""
    job = write_job(tmp_path / "job", JOB, {"train.py": TRAIN})
    job_id = runner.json("submit", str(job))["id"]
    done = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), what="the end")
    assert done["state"] == "SUCCEEDED", runner("logs", job_id).stdout
    status = runner.json("status", job_id)
    failure = status["last_checkpoint_failure"]
    assert failure["attempt"] == 1
    assert "step 1 not saved on the local tier" in failure["message"]
    assert "save failed" in runner("status", job_id).stdout
