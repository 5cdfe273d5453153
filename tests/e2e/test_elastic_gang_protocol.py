"""An elastic 3-node gang on the local market, with real nodes, agents and controller, and a training side that
speaks the control channel by hand (tests/e2e/elastic_protocol_trainee.py): node 1 vanishes without a notice, node
2 gets a notice, and the survivors go on in the same processes while each replacement joins; one attempt in all,
with its world sizes in the restart log."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import yaml

from conftest import Controller, Runner, kill_nodes, write_job
from output_search import first, occurrences

TRAINEE = Path(__file__).resolve().parent / "elastic_protocol_trainee.py"
JOB = """
name: elastic
run: python elastic_protocol_trainee.py {finish}
resources: {{cloud: [local], num_nodes: 3, min_nodes: 2}}
recovery: {{resume_drill: "off", max_failures: 0}}
"""


def _sizes(runner: Runner, job_id: str) -> list[int]:
    """What `runner restarts` prints, through the CLI's own code in this process (the waits poll it)."""
    return [w["world_size"] for w in runner.restarts(job_id)[0].get("world_sizes") or []]


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_survivors_train_on_in_the_same_processes_while_each_lost_node_is_replaced(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    # AWS's 2-minute notice at half speed: 60 s, time for the node on notice to train on (agents/train_through.py)
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.5}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        folder, finish = tmp_path / "job", tmp_path / "finish"
        folder.mkdir()
        shutil.copy(TRAINEE, folder / TRAINEE.name)
        job_id = runner.json("submit", str(write_job(folder, JOB.format(finish=finish))))["id"]
        runner.wait_for_output(job_id, r"step 40 world 3", timeout=120)
        pid0 = first(r"pid (\d+) start", runner("logs", job_id, "--node", "0").stdout).group(1)

        vanished = runner("preempt", job_id, "--node", "1", "--notice", "none")
        assert vanished.returncode == 0 and "vanished without a notice" in vanished.stdout, vanished.stderr
        _wait(lambda: _sizes(runner, job_id)[:2] == [3, 2], 60, "the shrink to 2 nodes")
        _wait(lambda: _sizes(runner, job_id)[:3] == [3, 2, 3], 120, "the replacement of node 1 to join")

        noticed = runner("preempt", job_id, "--node", "2", "--notice", "aws")
        assert noticed.returncode == 0, noticed.stderr
        _wait(lambda: _sizes(runner, job_id) == [3, 2, 3, 2], 60, "the shrink after node 2's notice")
        _wait(lambda: _sizes(runner, job_id) == [3, 2, 3, 2, 3], 120, "the replacement of node 2 to join")

        finish.write_text("done")
        job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=120, what="the end")
        assert job["state"] == "SUCCEEDED" and job["attempts"] == 1 and job["preemptions"] == 2
        (row,) = runner.json("restarts", job_id)
        steps = [w["step"] for w in row["world_sizes"]]
        assert steps[0] == 0 and steps == sorted(steps) and steps[1] > 0
        ends = {n["rank"]: n["end_reason"] for n in row["nodes"]}
        assert ends == {0: "succeeded", 1: "lost", 2: "preempted", 3: "succeeded", 4: "succeeded"}, ends
        assert all(n.get("joined_at") for n in row["nodes"] if n["rank"] >= 3)
        out0 = runner("logs", job_id, "--node", "0").stdout
        assert set(occurrences(r"pid (\d+) ", out0)) == {pid0}  # node 0's training was never restarted
        assert "moved to generation 1 as node 0 of 2" in out0 and "moved to generation 4 as node 0 of 3" in out0
        joiner = runner("logs", job_id, "--node", "3").stdout
        assert "joining=1 min_nodes=2" in joiner and "moved to generation 2 as node 2 of 3" in joiner
        table = runner("restarts", job_id).stdout
        assert "WORLD" in table and ">" in table
    finally:
        controller.stop()
        kill_nodes(home)
