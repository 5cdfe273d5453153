"""A gang whose training ended during a notice succeeds with one attempt though the node on notice is reclaimed at
its deadline while a peer's ranks still tear down.

Node 1 of a 2 x 2 torchrun gang gets an AWS notice whose deadline leaves time (the local market's clock at 0.25:
30 s, where the job's end and node 1's report take seconds: 6 s at a load of 6 on 2 cores, and the timer acts some
4 s before the deadline), so the gang trains on while the controller prepares the replacement; the replacement's
setup waits for the whole test, so the controller's word never comes and only the notice's deadline timer acts on
node 1. Meanwhile the job ends: the test tells the training to finish (every rank agrees on the step) and each rank
closes its Checkpointer after its last step. Rank 0 (on node 0) then tears down slowly, on purpose, until the test
lets it go: node 1's ranks have exited, its node reports ``succeeded``, and the local market reclaims it at the
deadline while rank 0 still lingers. Only once the controller has seen node 1 gone does rank 0 exit. Node 1's loss
after it finished its part is no loss: the attempt ends with node 0's report, the job succeeds with its one attempt,
nothing is trained again and no process is left.

Every wait is for an event (a line of output, a line of an agent's log, a node's state), never for a time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import Controller, Runner, kill_nodes, write_job
from local_nodes import agent_events, kill_processes_naming, node_alive, processes_naming, wait_until
from output_search import occurrences

TRAINEE = """
import sys, time
from pathlib import Path
import torch
import torch.distributed as dist
from runner.checkpoint import Checkpointer

finish, release = Path(sys.argv[1]), Path(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model=model, optimizer=optimizer, every_steps=10)
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
if rank == 0:  # a slow teardown, on rank 0 only: it outlasts node 1, which the market reclaims meanwhile
    give_up = time.monotonic() + 600
    while not release.exists() and time.monotonic() < give_up:
        time.sleep(0.05)
dist.destroy_process_group()
print(f"rank {rank}: exits", flush=True)
"""
TORCHRUN = ("torchrun --nnodes=$RUNNER_NUM_NODES --node-rank=$RUNNER_NODE_RANK --nproc-per-node=2 "
            "--master-addr=$RUNNER_MASTER_ADDR --master-port=$RUNNER_MASTER_PORT")
TIMER = "the deadline nears and the replacement is not ready: emergency checkpoint now"
WORD = "the replacement is ready (or none is coming): emergency checkpoint now"
ENDED = "every training process has closed; ending the launcher, left waiting at its exit"


def _job(files: Path) -> str:
    finish, release, hold, go = (files / name for name in ("finish", "release", "hold", "go"))
    # The gang's nodes run setup at once; the replacement, launched once ``hold`` exists, waits for ``go``, which
    # comes only when the test is over: the controller never says the replacement is ready.
    setup = f"if [ -e {hold} ]; then while [ ! -e {go} ]; do sleep 0.1; done; fi"
    return (f"name: reclaimed-after-finishing\nsetup: {setup!r}\nrun: {TORCHRUN} train.py {finish} {release}\n"
            "resources: {cloud: [local], num_nodes: 2}\n"
            "recovery: {max_preemptions: 3, max_failures: 0, resume_drill: 'off'}\n")


@pytest.mark.timeout(900)
def test_a_gang_node_reclaimed_after_its_part_succeeded_ends_nothing_and_the_job_succeeds_once(tmp_path):
    home, files = tmp_path / "home", tmp_path / "files"
    home.mkdir()
    files.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 0.25, "boot_seconds": 1.0}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        job_id = runner.json("submit", str(write_job(tmp_path / "job", _job(files), {"train.py": TRAINEE})))["id"]
        runner.wait_for_output(job_id, r"step 25\b", timeout=400)  # a few commits: the checkpoint's time is known
        (files / "hold").touch()
        preempted = runner("preempt", job_id, "--node", "1", "--notice", "aws")
        assert preempted.returncode == 0, preempted.stderr
        first = wait_until(lambda: (row := runner.restarts(job_id)[0]).get("standby") and row, 300,
                           "the replacement's launch")
        node1 = first["nodes"][1]["node"]

        # The job reaches its last step while the notice is trained through; rank 0 lingers after it.
        (files / "finish").touch()
        wait_until(lambda: sum(len(occurrences(r"rank \d: finished at step \d+", runner.output(job_id, 1, node)))
                               for node in (0, 1)) == 4, 300, "every rank's last step")
        # The notice's own timer acts on node 1 (the controller's word never comes), then the market reclaims node 1
        # at the deadline, and the controller sees it gone, while rank 0 still tears down.
        wait_until(lambda: TIMER in agent_events(home, node1), 300, "node 1's deadline timer")
        wait_until(lambda: not node_alive(home, node1), 300, "node 1's reclaim")
        wait_until(lambda: (job := runner.job(job_id))["state"] != "RUNNING" or all(
            n["id"] != node1 or n["state"] != "running" for n in job.get("nodes") or []), 300,
            "the controller's finding that node 1 is gone")
        assert not (files / "release").exists() and occurrences(r"rank 0: exits", runner.output(job_id)) == []
        (files / "release").touch()

        # (an attempt ended by node 1's loss would leave the job RECOVERING, its next attempt waiting for the
        # replacement's setup)
        job = runner.wait_for(job_id, lambda j: j["state"] != "RUNNING", timeout=400, what="the attempt's end")
        rows = runner.restarts(job_id)
        output = runner.output(job_id)
        if job["state"] == "SUCCEEDED":  # nothing is left running: every node, the replacement too, and every process
            nodes = [n["node"] for n in rows[0]["nodes"]] + [rows[0]["standby"]["node"]]
            wait_until(lambda: not any(node_alive(home, n) for n in nodes), 120, "every node's end")
            wait_until(lambda: not processes_naming(files), 120, "the end of every process of the job")
    finally:
        for name in ("release", "go"):  # (a rank torchrun started leads a session of its own: not a node's to kill)
            (files / name).touch()
        try:
            controller.stop()
        finally:  # a failing test leaves nothing behind: the nodes, then what outlived them
            kill_nodes(home)
            kill_processes_naming(files)

    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 0 and job["attempts"] == 1, (job, rows)
    assert len(rows) == 1 and rows[0]["end_reason"] == "succeeded" and rows[0]["notice"] is not None
    assert [n["end_reason"] for n in rows[0]["nodes"]] == ["succeeded", "succeeded"]
    assert rows[0]["standby"]["outcome"] == "released"
    events = agent_events(home, node1)
    assert WORD not in events  # the timer acted, not the controller
    # Node 1's launcher, left at its exit barrier once its ranks had exited, was ended then, not at the deadline: its
    # success was reported well before the reclaim
    assert events.index(ENDED) < events.index(TIMER)
    # No rank was stopped, signalled or relaunched: each finished, then exited by itself.
    assert "stopping at step" not in output and "resumed from step" not in output
    assert len(occurrences(r"rank \d: exits", output)) == 4
