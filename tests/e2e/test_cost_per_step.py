"""A job with accelerator alternatives runs where a step is cheapest, on the local market (a real controller,
real nodes, the checkpoint library's telemetry).

The job accepts a T4 or an L4. Its training step takes twenty times longer on the simulated T4 (``sim-t4``) than
on the simulated L4 (``sim-l4``), which costs about 1.5 times as much an hour: the L4's step is the cheaper, and stays
so on a busy machine (the L4 wins while the library's own overhead per step stays under about 0.38 s).
Before anything is measured the job goes where the hour is cheapest (the T4). After that attempt measured its
speed, the relaunch that a preemption causes lands on the L4, estimated from the T4's speed through the
catalog's relative-throughput table; the one after that on the L4 again, now measured there.
"""

from __future__ import annotations

import re

from e2e_fixtures import home  # noqa: F401 - a less compressed clock for these tests
from conftest import write_job

TRAIN = """
import os
import time

import torch
from runner.checkpoint import Checkpointer

where = os.environ["RUNNER_INSTANCE_TYPE"]
delay = {"sim-t4": 0.2, "sim-l4": 0.01}[where]  # twenty times the speed on the L4
ckpt = Checkpointer(model=torch.nn.Linear(2, 1), every_steps=50)
step = ckpt.restore()
print(f"attempt {os.environ['RUNNER_ATTEMPT']} on {where} in {os.environ['RUNNER_ZONE']} "
      f"({os.environ['RUNNER_CLOUD']}, spot {os.environ['RUNNER_SPOT']}) from step {step}", flush=True)
start = step
while True:
    time.sleep(delay)
    step += 1
    ckpt.step(step)
    if (step - start) % 25 == 0:
        print(f"attempt {os.environ['RUNNER_ATTEMPT']} trained {step - start}", flush=True)
    if ckpt.should_stop:
        break
ckpt.close()
"""
JOB = """
name: alternatives
run: python train.py
resources: {cloud: [local], accelerators: [T4:1, L4:1], spot_policy: spot}
recovery: {max_preemptions: 5, max_failures: 0, resume_drill: "off", prepare_on: []}  # each relaunch placed at the handover, whose placement figures the attempt message carries
"""


def trained(runner, job_id: str, attempt: int, steps: int) -> None:
    """Wait until the attempt has trained this many steps (and told the controller its speed: the library reports
    every 5 s and at each commit)."""
    runner.wait_for_output(job_id, rf"^attempt {attempt} trained {steps}$", timeout=120)


def test_the_relaunch_after_a_measured_attempt_lands_on_the_cheaper_step(tmp_path, runner, controller):
    write_job(tmp_path / "job", JOB, {"train.py": TRAIN})
    job_id = runner.json("submit", str(tmp_path / "job" / "job.yaml"))["id"]

    trained(runner, job_id, 1, 25)  # 5 s or more on the T4; its speed is reported within 5 s of its start
    runner.wait_for(job_id, lambda j: (j.get("steps_per_second") or 0) > 0, timeout=60, what="a measured speed")
    assert runner("preempt", job_id, "--notice", "aws").returncode == 0
    trained(runner, job_id, 2, 600)
    assert runner("preempt", job_id, "--notice", "aws").returncode == 0
    trained(runner, job_id, 3, 50)
    rows = runner.restarts(job_id)
    assert runner("cancel", job_id).returncode == 0

    first, second, third = rows[:3]
    assert [r["instance_type"] for r in rows[:3]] == ["sim-t4", "sim-l4", "sim-l4"], rows
    assert [r["end_reason"] for r in rows[:3]] == ["preempted", "preempted", "running"]
    # The first launch knew no speed: the cheapest hour.
    assert first["message"].startswith("the cheapest hour, no steps/s known yet: T4 spot in local-a (sim-t4): "
                                       "$0.1825/h; L4 spot in local-a (sim-l4): $0.2717/h"), first["message"]
    # The second: the L4's speed estimated from the T4's measurement; the T4's measured.
    assert re.search(r"L4 spot in local-\w \(sim-l4\): \$[0-9.]+/h at [0-9.]+ steps/s estimated from sim-t4 = "
                     r"\$[0-9.e-]+/1k steps; T4 spot in local-\w \(sim-t4\): \$[0-9.]+/h at [0-9.]+ steps/s "
                     r"measured", second["message"]), second["message"]
    # The third: both measured, the L4 chosen first.
    assert re.search(r"^L4 spot in local-\w \(sim-l4\): .* steps/s measured = .*; T4 spot in .* steps/s measured",
                     third["message"]), third["message"]

    output = runner.output(job_id)
    for attempt, where in ((1, first), (2, second), (3, third)):
        assert f"attempt {attempt} on {where['instance_type']} in {where['zone']} (local, spot 1)" in output
