"""`runner cancel` while a notice is trained through: the node on notice and its replacement both go.

A node gets an AWS notice whose deadline leaves time (the local market's clock at 2.0: 240 s); the controller
launches the replacement, whose setup waits (on a file the test never creates) while the job trains on. The user
cancels: the job ends CANCELLED with its one attempt, the replacement is released (its restart-log record says
so), and nothing is left running: neither node, nor the training, nor the replacement's setup.

Every wait is for an event (a line of output, a restart-log field, a process's end), never for a time. A failing
test leaves nothing behind either: its fixtures stop the controller, kill the nodes and then any process of the job
that outlived its node.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import kill_nodes, write_job
from local_nodes import kill_processes_naming, node_alive, processes_naming, wait_until

TRAINEE = """
import sys, time
import torch
from runner.checkpoint import Checkpointer

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model=model, optimizer=optimizer, every_steps=10)
step = ckpt.restore()
while not ckpt.should_stop:
    optimizer.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()
    step += 1
    print(f"step {step}", flush=True)
    ckpt.step(step)
    time.sleep(0.1)
ckpt.close()
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The local market's clock at 2.0: an AWS notice leaves 240 s, time to launch the replacement meanwhile."""
    path = tmp_path / "home"
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 2.0}}}))
    yield path
    kill_nodes(path)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """The job's folder of markers, named on the command line of each of its processes; the last fixture to end
    (after the controller and the nodes): kills what is left of the job wherever it went."""
    path = tmp_path / "files"
    path.mkdir()
    yield path
    kill_processes_naming(path)


@pytest.mark.timeout(900)
def test_a_cancel_during_a_notice_releases_the_node_on_notice_and_its_replacement(tmp_path, files, home, runner,
                                                                                   controller):
    marker, never = files / "first-setup-done", files / "never"
    setup = f"if [ -e {marker} ]; then while [ ! -e {never} ]; do sleep 0.1; done; else touch {marker}; fi"
    text = (f"name: cancel-on-notice\nsetup: {setup!r}\nrun: python train.py {files}\nresources: {{cloud: [local]}}\n"
            "recovery: {max_preemptions: 3, max_failures: 0, resume_drill: 'off'}\n")
    job_id = runner.json("submit", str(write_job(tmp_path / "job", text, {"train.py": TRAINEE})))["id"]
    runner.wait_for_output(job_id, r"^step 20$", timeout=400)  # a few commits: the checkpoint's time is known
    assert runner("preempt", job_id, "--notice", "aws").returncode == 0
    first = wait_until(lambda: (row := runner.restarts(job_id)[0]).get("standby") and row, 300,
                       "the replacement's launch")
    standby = first["standby"]["node"]
    wait_until(lambda: len(processes_naming(never)) > 0, 300, "the replacement's setup")  # it is getting ready
    assert runner("cancel", job_id).returncode == 0

    job = runner.wait_for(job_id, lambda j: j["state"] in ("CANCELLED", "SUCCEEDED", "FAILED"), timeout=300,
                          what="the cancel")
    wait_until(lambda: not any(node_alive(home, n) for n in (first["node"], standby)), 120, "every node's end")
    wait_until(lambda: not processes_naming(files), 120, "the end of every process of the job")
    rows = runner.restarts(job_id)

    assert job["state"] == "CANCELLED" and job["attempts"] == 1, job
    assert len(rows) == 1 and rows[0]["end_reason"] == "cancelled"
    assert rows[0]["standby"]["outcome"] == "released" and rows[0]["standby"]["released_at"] is not None
