"""A job that reaches its last step while a notice is trained through has succeeded: it is not relaunched.

A node gets an AWS notice whose deadline leaves time (the local market's clock at 2.0: 240 s), so the job trains on
while the controller prepares the replacement. The replacement's setup waits until the test lets it go. Meanwhile the
job ends: the test tells the training to finish (every rank agrees on the step), each rank closes its Checkpointer
after its last step and lingers, as a rank tearing down slowly does (its process group's teardown, a launcher's exit
barrier), until the test lets it exit. Only then does the replacement get ready, so the controller tells the node on
notice to checkpoint while its ranks have finished training but are still there. That stop has nothing to save and
nobody to stop: no rank is signalled, the ranks exit 0, the job succeeds with its one attempt, and the replacement
(and, for a gang, the next attempt started ahead on every node) is released with nothing left running.

Every wait is for an event (a line of output, a line of an agent's log, a restart-log field), never for a time.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import Controller, Runner, kill_nodes, write_job
from local_nodes import agent_events, kill_processes_naming, node_alive, processes_naming, wait_until

TRAINEE = """
import os, sys, time
from pathlib import Path
import torch
from runner.checkpoint import Checkpointer

finish, linger = Path(sys.argv[1]), Path(sys.argv[2])
gang = "RANK" in os.environ  # started by torchrun
if gang:
    import torch.distributed as dist
    dist.init_process_group("gloo")
rank = dist.get_rank() if gang else 0
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
if gang:
    model = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model=model, optimizer=optimizer, every_steps=10)  # commits time the checkpoint
step = ckpt.restore()
print(f"rank {rank}: " + (f"resumed from step {step}" if step else "starting fresh"), flush=True)
while not ckpt.should_stop:
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
    step += 1
    if rank == 0:
        print(f"step {step}", flush=True)
    done = torch.tensor([1.0 if finish.exists() else 0.0])
    if gang:
        dist.all_reduce(done, op=dist.ReduceOp.MAX)  # every rank ends at one step
    ckpt.step(step)
    if done.item() > 0:
        break
    time.sleep(0.1)
ckpt.close()
if ckpt.should_stop:
    print(f"rank {rank}: stopping at step {step}", flush=True)
    sys.exit(0)
print(f"rank {rank}: finished at step {step}", flush=True)
give_up = time.monotonic() + 300
while not linger.exists() and time.monotonic() < give_up:  # a slow teardown after the last step
    time.sleep(0.05)
if gang:
    dist.destroy_process_group()
print(f"rank {rank}: exits", flush=True)
"""
TORCHRUN = ("torchrun --nnodes=$RUNNER_NUM_NODES --node-rank=$RUNNER_NODE_RANK --nproc-per-node=2 "
            "--master-addr=$RUNNER_MASTER_ADDR --master-port=$RUNNER_MASTER_PORT")


def _job(num_nodes: int, files: Path) -> str:
    finish, linger, hold, go = (files / name for name in ("finish", "linger-done", "hold", "go"))
    launcher = TORCHRUN if num_nodes > 1 else "python"
    # The first nodes run setup at once; the replacement, launched once ``hold`` exists, waits for ``go``.
    setup = f"if [ -e {hold} ]; then while [ ! -e {go} ]; do sleep 0.1; done; fi"
    return (f"name: ends-during-notice\nsetup: {setup!r}\nrun: {launcher} train.py {finish} {linger}\n"
            f"resources: {{cloud: [local], num_nodes: {num_nodes}}}\n"
            "recovery: {max_preemptions: 3, max_failures: 0, resume_drill: 'off'}\n")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("num_nodes", [2, 1], ids=["gang", "single-node"])
def test_a_job_that_ends_while_its_notice_is_trained_through_succeeds_with_one_attempt(tmp_path, num_nodes):
    home, files = tmp_path / "home", tmp_path / "files"
    home.mkdir()
    files.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 2.0, "boot_seconds": 1.0}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    noticed = num_nodes - 1  # the gang's node 1, or the single node
    try:
        job_id = runner.json("submit", str(write_job(tmp_path / "job", _job(num_nodes, files),
                                                     {"train.py": TRAINEE})))["id"]
        runner.wait_for_output(job_id, r"^step 25$", timeout=400)  # a few commits: the checkpoint's time is known
        (files / "hold").touch()
        preempted = runner("preempt", job_id, *(["--node", "1"] if num_nodes > 1 else []), "--notice", "aws")
        assert preempted.returncode == 0, preempted.stderr
        first = wait_until(lambda: (row := runner.restarts(job_id)[0]).get("standby") and row, 300,
                      "the replacement's launch")
        assert first["standby"]["reason"] == "notice"
        node = first["nodes"][noticed]["node"] if num_nodes > 1 else first["node"]

        # The job reaches its last step while the notice is trained through; its ranks close and linger.
        (files / "finish").touch()
        ranks = 2 * num_nodes if num_nodes > 1 else 1
        # (no anchors: two ranks printing at once share a line, "rank 0: finished at step 30rank 1: finished ...")
        wait_until(lambda: sum(len(re.findall(r"rank \d: finished at step \d+", runner.output(job_id, 1, node)))
                          for node in range(num_nodes)) == ranks, 300, "every rank's last step")
        # Now the replacement gets ready, and the node on notice is told to checkpoint while its ranks linger.
        (files / "go").touch()
        wait_until(lambda: "the replacement is ready (or none is coming): emergency checkpoint now"
              in agent_events(home, node), 400, "the controller's word to the node on notice")
        (files / "linger-done").touch()

        job = runner.wait_for(job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED"), timeout=300, what="the end")
        rows = runner.restarts(job_id)
        output = runner.output(job_id)
        nodes = [n["node"] for n in rows[0].get("nodes") or []] or [rows[0]["node"]]
        standby = rows[0]["standby"]["node"]
        # Nothing is left running: every node of the job, the replacement too, is terminated, and no process of the
        # job (the next attempt started ahead on every node of a gang included) outlives them.
        wait_until(lambda: not any(node_alive(home, n) for n in [*nodes, standby]), 120, "every node's end")
        wait_until(lambda: not processes_naming(files), 120, "the end of every process of the job")
    finally:
        (files / "linger-done").touch()  # a rank torchrun started leads a session of its own: not a node's to kill
        try:
            controller.stop()
        finally:  # a failing test leaves nothing behind: the nodes, then what outlived them
            kill_nodes(home)
            kill_processes_naming(files)

    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 0 and job["attempts"] == 1, (job, rows)
    assert len(rows) == 1 and rows[0]["end_reason"] == "succeeded"
    assert rows[0]["notice"] is not None
    assert rows[0]["standby"]["outcome"] == "released" and rows[0]["standby"]["released_at"] is not None
    # No rank was stopped, signalled or relaunched: each finished, then exited by itself.
    assert "stopping at step" not in output and "resumed from step" not in output
    assert len(re.findall(r"rank \d: exits", output)) == ranks  # (two ranks' lines may share one)
    if num_nodes > 1:
        assert [n["end_reason"] for n in rows[0]["nodes"]] == ["succeeded", "succeeded"]
