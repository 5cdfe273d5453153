"""A 3-node elastic gang (torchrun, one DDP process per node, gloo on CPU) on the local market with the real
checkpoint library: node 1 vanishes without a notice, then node 2 gets an AWS notice. Each time the survivors
go on in the same processes in a world of 2, the replacement joins with the state from a peer, and the world is
3 again; the job finishes in its one attempt, its world sizes in the restart log."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from conftest import Controller, Runner, kill_nodes, write_job
from elastic_waits import wait_until, world_sizes
from output_search import first, occurrences

pytestmark = pytest.mark.timeout(900)  # torch in a replacement's two processes, twice, on a busy machine
TRAIN = Path(__file__).resolve().parent / "elastic_train.py"
JOB = """
name: elastic
run: >-
  torchrun --nnodes=$RUNNER_NUM_NODES --node-rank=$RUNNER_NODE_RANK --nproc-per-node=1
  --master-addr=$RUNNER_MASTER_ADDR --master-port=$RUNNER_MASTER_PORT elastic_train.py --steps 100000
  --finish {finish}
resources: {{cloud: [local], num_nodes: 3, min_nodes: 2}}
checkpoint: {{interval: 1h}}
recovery: {{resume_drill: "off", max_failures: 0}}
"""


def _last_step(runner: Runner, job_id: str) -> int:
    steps = occurrences(r"pid \d+ step (\d+) ", runner.output(job_id, node=0))
    return int(steps[-1]) if steps else 0


def test_a_gang_shrinks_and_grows_back_twice_in_one_attempt_with_the_same_survivor_processes(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    # AWS's notice at half speed (60 s): time for the node on notice to train on while the others leave it
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.5}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        folder = tmp_path / "job"
        folder.mkdir()
        shutil.copy(TRAIN, folder / TRAIN.name)
        finish = tmp_path / "finish"
        job_id = runner.json("submit", str(write_job(folder, JOB.format(finish=finish))))["id"]
        runner.wait_for_output(job_id, r"pid \d+ step 40 world 3", timeout=240)
        pid0 = first(r"pid (\d+) rank 0 of 3", runner("logs", job_id, "--node", "0").stdout).group(1)

        assert runner("preempt", job_id, "--node", "1", "--notice", "none").returncode == 0
        wait_until(lambda: world_sizes(runner, job_id)[:2] == [3, 2], 90, "the shrink to 2", runner, job_id)
        shrunk_at = _last_step(runner, job_id)
        wait_until(lambda: _last_step(runner, job_id) >= shrunk_at + 20, 90, "training in the smaller world", runner, job_id)
        wait_until(lambda: world_sizes(runner, job_id)[:3] == [3, 2, 3], 240, "node 1's replacement to join", runner, job_id)

        assert runner("preempt", job_id, "--node", "2", "--notice", "aws").returncode == 0
        wait_until(lambda: world_sizes(runner, job_id)[:4] == [3, 2, 3, 2], 90, "the shrink after the notice", runner, job_id)
        wait_until(lambda: world_sizes(runner, job_id) == [3, 2, 3, 2, 3], 240, "node 2's replacement to join", runner, job_id)
        job = runner.json("status", job_id)
        assert job["state"] == "RUNNING" and job["attempts"] == 1 and job["preemptions"] == 2
        out0 = runner("logs", job_id, "--node", "0").stdout
        assert set(occurrences(r"pid (\d+) ", out0)) == {pid0}  # node 0's training was never restarted
        assert len(occurrences(r"pid \d+ step \d+ world changed", out0)) == 4
        joined = runner("logs", job_id, "--node", "3").stdout
        assert first(r"pid \d+ rank 2 of 3 from step [1-9]\d*", joined)  # the state came from a peer
        (row,) = runner.json("restarts", job_id)
        steps = [w["step"] for w in row["world_sizes"]]
        assert steps == sorted(steps) and steps[1] > 0
        assert {n["rank"]: n["end_reason"] for n in row["nodes"]}.get(1) == "lost"
        finish.write_text("done")  # every rank ends at one step; the launchers do not wait for the nodes that left
        job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=120, what="the end")
        assert job["state"] == "SUCCEEDED" and job["attempts"] == 1, runner.json("restarts", job_id)
    finally:
        controller.stop()
        kill_nodes(home)
