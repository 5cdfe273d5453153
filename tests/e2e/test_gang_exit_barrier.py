"""A 2-node gang (torchrun, one DDP process per node, gloo on CPU) that is not elastic: node 1 gets a GCP notice,
every rank stops at one step with the emergency checkpoint, and node 1's training process does not exit (it
lingers after its last step, as a process flushing its logs might) until its agent ends it at the deadline.

Node 0's worker has exited cleanly, so node 0's torchrun waits in its exit barrier (300 s in torch) for node 1's
torchrun, which never comes: it was ended without reaching the barrier. Once node 1's exit has ended the attempt,
the controller tells node 0 to stop; its agent must end the launcher then, not wait out the barrier, so the next
attempt starts on node 0 and node 1's replacement well before the barrier's 300 s.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from conftest import Controller, Runner, kill_nodes, write_job

pytestmark = pytest.mark.timeout(600)
TRAIN = Path(__file__).resolve().parent / "elastic_train.py"
LINGER = """\
import os, runpy, sys, time

sys.argv = ["elastic_train.py", *sys.argv[1:]]
try:
    runpy.run_path("elastic_train.py", run_name="__main__")
except SystemExit:
    pass
if os.environ["RUNNER_NODE_RANK"] == "1" and os.environ["RUNNER_ATTEMPT"] == "1":
    print("node 1 lingers after its last step", flush=True)
    time.sleep(3600)
"""
JOB = """
name: exit-barrier
run: >-
  torchrun --nnodes=$RUNNER_NUM_NODES --node-rank=$RUNNER_NODE_RANK --nproc-per-node=1
  --master-addr=$RUNNER_MASTER_ADDR --master-port=$RUNNER_MASTER_PORT linger.py --steps 100000 --finish {finish}
resources: {{cloud: [local], num_nodes: 2}}
checkpoint: {{interval: 1h}}
recovery: {{resume_drill: "off", max_failures: 0, max_preemptions: 3}}
"""
# Torch's exit barrier lasts 300 s: the next attempt must not wait for it. The wait below is the event's own
# (generous on a busy machine: a notice of 15 s, a replacement's boot and two torch imports), and shorter.
NEXT_ATTEMPT_TIMEOUT = 240


def test_a_kept_node_ends_its_launcher_waiting_for_a_peer_that_left_and_the_next_attempt_starts(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.5}}}))  # GCP: 15 s
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        folder = tmp_path / "job"
        folder.mkdir()
        shutil.copy(TRAIN, folder / TRAIN.name)
        (folder / "linger.py").write_text(LINGER)
        finish = tmp_path / "finish"
        job_id = runner.json("submit", str(write_job(folder, JOB.format(finish=finish))))["id"]
        runner.wait_for_output(job_id, r"pid \d+ step 20 world 2", timeout=240)

        assert runner("preempt", job_id, "--node", "1", "--notice", "gcp").returncode == 0
        runner.wait_for_output(job_id, r"node 1 lingers after its last step", timeout=120, attempt=1)
        runner.wait_for_output(job_id, r"pid \d+ rank 0 of 2 from step [1-9]", timeout=NEXT_ATTEMPT_TIMEOUT,
                               attempt=2)
        first = runner.restarts(job_id)[0]
        assert first["end_reason"] == "preempted"
        assert [(n["rank"], n["end_reason"]) for n in first["nodes"]] == [(0, "kept"), (1, "preempted")]

        finish.write_text("done")  # attempt 2 ends cleanly: no node lingers in it
        job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=180, what="the end")
        assert job["state"] == "SUCCEEDED" and job["attempts"] == 2, runner.restarts(job_id)
    finally:
        controller.stop()
        kill_nodes(home)
