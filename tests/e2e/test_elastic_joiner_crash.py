"""A 3-node elastic gang (torchrun, one DDP process per node, gloo on CPU) on the local market: node 1 vanishes,
the replacement joins and its training process crashes right after ``restore()`` while its node stays up. The
survivors train on in the same processes in a world of 2, the crashed replacement's node goes, another replacement
joins, and the job finishes in its one attempt; the restart log says what became of the replacement."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import local_controller, write_job
from elastic_waits import wait_until, world_sizes
from output_search import first, occurrences

pytestmark = pytest.mark.timeout(900)
TRAIN = Path(__file__).resolve().parent / "elastic_train.py"
JOB = """
name: elastic-crash
run: >-
  torchrun --nnodes=$RUNNER_NUM_NODES --node-rank=$RUNNER_NODE_RANK --nproc-per-node=1
  --master-addr=$RUNNER_MASTER_ADDR --master-port=$RUNNER_MASTER_PORT elastic_train.py --steps 100000
  --finish {finish} --crash-joiner {crashed}
resources: {{cloud: [local], num_nodes: 3, min_nodes: 2}}
checkpoint: {{interval: 1h}}
recovery: {{resume_drill: "off", max_failures: 1}}
"""


@pytest.fixture
def runner(tmp_path):
    """A controller on the local market at full speed (time_scale 1), the CLI pointed at it."""
    home = tmp_path / "home"
    home.mkdir()
    yield from local_controller(home, time_scale=1.0)


def test_a_replacement_whose_training_crashes_after_it_joined_leaves_and_another_joins(tmp_path, runner):
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(TRAIN, folder / TRAIN.name)
    finish, crashed = tmp_path / "finish", tmp_path / "crashed"
    job_id = runner.json("submit", str(write_job(folder, JOB.format(finish=finish, crashed=crashed))))["id"]
    runner.wait_for_output(job_id, r"pid \d+ step 40 world 3", timeout=240)
    pid0 = first(r"pid (\d+) rank 0 of 3", runner("logs", job_id, "--node", "0").stdout).group(1)

    assert runner("preempt", job_id, "--node", "1", "--notice", "none").returncode == 0
    wait_until(lambda: world_sizes(runner, job_id)[:2] == [3, 2], 90, "the shrink to 2", runner, job_id)
    wait_until(crashed.exists, 240, "the first replacement to join and crash", runner, job_id)
    # Its world is left again (3, then 2), and the next replacement joins (3).
    wait_until(lambda: world_sizes(runner, job_id)[:5] == [3, 2, 3, 2, 3], 300, "the second replacement to join",
               runner, job_id)
    job = runner.json("status", job_id)
    assert job["state"] == "RUNNING" and job["attempts"] == 1
    out0 = runner("logs", job_id, "--node", "0").stdout
    assert set(occurrences(r"pid (\d+) ", out0)) == {pid0}  # node 0's training was never restarted
    (row,) = runner.json("restarts", job_id)
    ends = {n["rank"]: n for n in row["nodes"]}
    assert ends[1]["end_reason"] == "lost"
    assert ends[3]["end_reason"] == "failed" and ends[3].get("left_at")  # the replacement that crashed
    assert first(r"pid \d+ rank 2 of 3 from step [1-9]\d*", runner("logs", job_id, "--node", "4").stdout)
    finish.write_text("done")
    job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=120, what="the end")
    assert job["state"] == "SUCCEEDED" and job["attempts"] == 1, runner.json("restarts", job_id)
