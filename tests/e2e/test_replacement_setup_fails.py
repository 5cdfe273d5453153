"""The replacement prepared during a notice fails its `setup`: the job recovers as it would with none prepared.

A node gets an AWS notice whose deadline leaves time (the local market's clock at 0.2: 24 s); the controller
launches the replacement, whose `setup` exits 3 (only the second node's does: the job's first node and the one
launched after the failure set up fine). The replacement's agent reports the failure and the node goes; the node
on notice is told to stop (or, its timer first, is stopped at its held checkpoint), hands over, and the next
attempt runs on a newly launched node from exactly the handed-over step. The restart log's `standby` says the
replacement failed and why, and no node is left running.
"""

from __future__ import annotations


import pytest
import yaml

from trained_through_job import STEP, TRAINEE
from conftest import Controller, Runner, kill_nodes, write_job
from local_nodes import node_alive, wait_until



@pytest.mark.timeout(900)
def test_a_replacement_whose_setup_fails_is_released_and_the_job_recovers_from_the_handed_over_step(tmp_path):
    home, files = tmp_path / "home", tmp_path / "files"
    home.mkdir()
    files.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.2}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    one, two = files / "first-node", files / "second-node"
    setup = f"if [ ! -e {one} ]; then touch {one}; elif [ ! -e {two} ]; then touch {two}; exit 3; fi"
    text = (f"name: replacement-setup-fails\nsetup: {setup!r}\nrun: python train.py 300\n"
            "resources: {cloud: [local]}\nrecovery: {max_preemptions: 3, max_failures: 0, resume_drill: 'off'}\n")
    try:
        job_id = runner.json("submit", str(write_job(tmp_path / "job", text, {"train.py": TRAINEE})))["id"]
        runner.wait_for_output(job_id, r"^step 30 at ", timeout=400)  # a few commits: the checkpoint's time is known
        assert runner("preempt", job_id, "--notice", "aws").returncode == 0
        job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=480,
                              what="the end")
        first, second = runner.restarts(job_id)
        old_output = runner.output(job_id, 1)
        wait_until(lambda: not any(node_alive(home, n) for n in (first["node"], first["standby"]["node"],
                                                                 second["node"])), 120, "every node's end")
    finally:
        controller.stop()
        kill_nodes(home)

    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 1 and job["failures"] == 0, job
    standby = first["standby"]
    assert standby["outcome"] == "failed" and "exit code 3" in standby["failure"], standby
    assert standby["released_at"] is not None
    assert second["node"] not in (first["node"], standby["node"])  # a node launched after the failure
    trained = int(STEP.findall(old_output)[-1])
    assert first["end_reason"] == "preempted" and first["checkpoint_step"] == second["resumed_from_step"] == trained
