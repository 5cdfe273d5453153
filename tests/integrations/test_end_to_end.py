"""Each framework's example as a real job on the local provider: the resume drill, then a preemption.

The job is submitted to a real controller; the drill checkpoints through the callback, restarts the job on
the same node and checks that it restored that step; then `runner preempt` sends an AWS notice through the
node's metadata server, the agent asks the training for an emergency checkpoint over the control channel,
and the job resumes in another zone. The final weights must equal those of an uninterrupted run.
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from conftest import local_controller, write_job

from .conftest import REPO, load_example

FINAL = re.compile(r"final weights sha256 ([0-9a-f]{64})")
JOB = """
name: {name}
run: python train.py --steps {steps} --step-time {step_time}
env: {{HF_HUB_OFFLINE: "1"}}
resources: {{cloud: [local]}}
checkpoint: {{interval: 1h, keep: 2}}
recovery: {{max_preemptions: 3, max_failures: 0, resume_drill: 3s, prepare_on: []}}
"""  # stops at the notice: trained through, a job this short may end on the old node before its replacement is ready
CASES = {  # steps and the time added to each: enough left after the preemption is sent for it to land
    "transformers": {"steps": 60, "step_time": 0.15, "after_drill": 10},
    "lightning": {"steps": 300, "step_time": 0.03, "after_drill": 20},
}


def uninterrupted_sha(framework: str, steps: int, folder) -> str:
    """The example trained start to end in this process, outside the runner."""
    example = load_example(framework)
    rng = torch.get_rng_state()
    if framework == "transformers":
        trainer = example.build(example.parse(["--steps", str(steps), "--output-dir", str(folder)]))
        trainer.train()
        model = trainer.model
    else:
        trainer, model, loader = example.build(example.parse(["--steps", str(steps)]))
        next(c for c in trainer.callbacks if type(c).__name__ == "RunnerCallback").checkpoints.local_dir = folder
        trainer.fit(model, train_dataloaders=loader)
    torch.set_rng_state(rng)
    return example.weights_sha256(model)


@pytest.fixture
def local_cloud(tmp_path):
    """A controller on the local provider, its clock less compressed than the unit tests' (as tests/e2e)."""
    home = tmp_path / "home"
    home.mkdir()
    yield from local_controller(home, time_scale=0.2)


def _steps(runner, job_id: str, attempt: int) -> list[int]:
    return [int(n) for n in re.findall(r"^step (\d+)$", runner.output(job_id, attempt), re.M)]


@pytest.mark.parametrize("framework", sorted(CASES))
def test_the_drill_passes_and_a_preempted_job_resumes_where_it_stopped_bit_exact(tmp_path, local_cloud, framework):
    pytest.importorskip(framework)
    case = CASES[framework]
    runner = local_cloud
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(REPO / "examples" / framework / "train.py", folder / "train.py")
    text = JOB.format(name=f"{framework}-e2e", steps=case["steps"], step_time=case["step_time"])
    job_id = runner.json("submit", str(write_job(folder, text)))["id"]

    runner.wait_for(job_id, lambda j: j["attempts"] == 2, timeout=240, what="the drill's restart")
    drill_step = runner.restarts(job_id)[0]["checkpoint_step"]
    runner.wait_for(job_id, lambda j: any(s >= drill_step + case["after_drill"] for s in _steps(runner, job_id, 2)),
                    timeout=240, what="attempt 2 training on")
    assert runner("preempt", job_id, "--notice", "aws").returncode == 0
    job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=300, what="the end")
    logs = runner.output(job_id)
    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1, logs[-3000:]

    drilled, preempted, finished = runner.restarts(job_id)
    assert drilled["end_reason"] == "drill" and drilled["drill"]["passed"] is True, drilled
    assert drilled["drill"]["checkpoint_step"] == drilled["drill"]["resumed_step"] == drill_step > 0
    assert preempted["end_reason"] == "preempted" and preempted["resumed_from_step"] == drill_step
    second_attempt = runner.output(job_id, 2)
    assert f"stopping at step {drill_step} for the resume drill" in runner.output(job_id, 1)
    stopped_at = int(re.search(r"stopping at step (\d+) for a preemption", second_attempt).group(1))
    assert preempted["checkpoint_step"] == stopped_at == finished["resumed_from_step"] > drill_step
    assert finished["end_reason"] == "succeeded" and finished["zone"] != preempted["zone"]
    # Every step and its loss reached the job's telemetry (docs/restart-log.md) through the callback.
    trained = [drill_step, stopped_at - drill_step, case["steps"] - stopped_at]
    assert [row["steps"] for row in (drilled, preempted, finished)] == trained
    assert [row["nan_steps"] for row in (drilled, preempted, finished)] == [0, 0, 0]
    status = runner.json("status", job_id)
    assert status["steps_per_second"] > 0 and status["cost_per_1000_steps"] is not None
    assert status["manifest"]["torch"] == torch.__version__
    assert FINAL.search(logs).group(1) == uninterrupted_sha(framework, case["steps"], tmp_path / "reference")
