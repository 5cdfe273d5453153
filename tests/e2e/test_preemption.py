"""The whole chain on the local provider: a real PyTorch job preempted through each cloud's protocol.

`runner preempt` sends the notice through the node's own metadata server (AWS IMDSv2, GCP's metadata
server, Azure Scheduled Events); the agent's watcher sees it, the training process takes an emergency
checkpoint at the step it is on and stops, the node is reclaimed, and the job resumes on another zone.
The final weights must equal those of a run that was never interrupted.

The job stops at the notice (``recovery.prepare_on: []``): trained through by default, a job this short may
finish on the old node before its replacement is ready, a success with no preemption to check. The trained-
through path has its own tests (test_train_through_notice.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, Runner, shared_controller, write_job

TRAIN = REPO / "examples" / "quickstart" / "train.py"
STEPS = 160
ARGS = f"--steps {STEPS} --step-time 0.03 --log-every 10 --interval 1h"
JOB = f"""
name: preempt-me
run: python train.py {ARGS}
resources: {{cloud: [local]}}
checkpoint: {{interval: 1h}}
recovery: {{max_preemptions: 3, max_failures: 0, resume_drill: "off", prepare_on: []}}
"""
FINAL = re.compile(r"final weights sha256 ([0-9a-f]{64})")


@pytest.fixture(scope="module")
def uninterrupted_sha(tmp_path_factory) -> str:
    """The final weights of the same training run once, from start to end, outside the runner."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    out = subprocess.run([sys.executable, str(TRAIN), *ARGS.replace("0.03", "0").split()], cwd=folder,
                         capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    return FINAL.search(out.stdout).group(1)


@pytest.fixture(scope="module")
def market(tmp_path_factory) -> Runner:
    """One controller for the module's jobs, on the e2e tests' less compressed clock (tests/e2e/e2e_fixtures.py)."""
    yield from shared_controller(tmp_path_factory, time_scale=0.2)


@pytest.fixture(scope="module")
def preempted(market, tmp_path_factory):
    """``preempted(cloud)``: the id and final status of the job preempted once through ``cloud``'s notice at step 20
    or later, run once per cloud for the module (every test about that run reads the same job)."""
    runs: dict[str, tuple[str, dict]] = {}

    def run(cloud: str) -> tuple[str, dict]:
        if cloud not in runs:
            folder = tmp_path_factory.mktemp(f"job-{cloud}")
            shutil.copy(TRAIN, folder / "train.py")
            job_id = market.json("submit", str(write_job(folder, JOB)))["id"]
            market.wait_for_output(job_id, r"^step 20 ")
            assert market("preempt", job_id, "--notice", cloud).returncode == 0
            runs[cloud] = job_id, market.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"),
                                                  timeout=120, what="the end")
        return runs[cloud]

    return run


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_notice_checkpoints_at_the_current_step_and_resumes_bit_exact_in_another_zone(
        market, preempted, uninterrupted_sha, cloud):
    """Preempted through each protocol: the step it stopped at is the step saved and resumed; weights match."""
    runner = market
    job_id, job = preempted(cloud)
    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1

    first, second = runner.restarts(job_id)
    assert first["end_reason"] == "preempted"
    assert first["notice"]["source"] == cloud and first["notice"]["received_at"]
    logs = runner.output(job_id)
    stopped_at = int(re.search(r"stopping at step (\d+) for a preemption", logs).group(1))
    # No work lost: the emergency checkpoint is the step training had reached when the notice came.
    assert first["checkpoint_step"] == stopped_at == second["resumed_from_step"] > 20
    assert first["lost_seconds"] == 0.0
    assert second["zone"] != first["zone"]
    assert second["end_reason"] == "succeeded"
    assert f"resumed from step {stopped_at}" in logs
    assert FINAL.search(logs).group(1) == uninterrupted_sha


def test_every_attempts_output_is_kept_under_its_own_separator(market, preempted):
    """After a preemption (GCP's run above), `logs` shows both attempts' output in order, each under its separator."""
    runner = market
    job_id, job = preempted("gcp")
    assert job["state"] == "SUCCEEDED"

    logs = runner.output(job_id)
    one, two = logs.index("attempt 1"), logs.index("attempt 2")
    assert one < logs.index("step 10 ") < logs.index("stopping at step") < two < logs.index("final weights")
    only_second = runner.output(job_id, 2)
    assert "starting fresh" not in only_second and "resumed from step" in only_second
