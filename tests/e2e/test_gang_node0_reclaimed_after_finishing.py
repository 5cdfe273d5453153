"""A gang whose node 0 is on notice when the training ends succeeds with one attempt, though node 0 is reclaimed
while its launcher still hosts the store the other node's launcher waits on.

Node 0 of a 2 x 1 torchrun gang gets an AWS notice whose deadline leaves time (the local market's clock at 1.0:
120 s), so the gang trains on while the controller prepares the replacement; the replacement's setup waits for the
whole test, so the controller's word never comes and only the notice's deadline timer would act on node 0. Meanwhile
the job ends: the test tells the training to finish (both ranks agree on the step) and each rank closes its
Checkpointer after its last step. Rank 0 (node 0) exits at once; rank 1 (node 1) then ends slowly, on purpose, until
the test lets it go. Node 0's launcher (torchrun) waits at its exit barrier, hosting the store that node 1's launcher
will wait on: it is not ended, but the node reports that its part is done. The cloud reclaims node 0 right then (the
test kills it, as the reclaim at the deadline would, only sooner: the last seconds before the deadline are the margin
a report made then can miss). Only once the controller has seen node 0 gone does rank 1 exit. Node 0's loss after
its part was done is no loss: the attempt ends with node 1's report, the job succeeds with its one attempt, nothing is
trained again and no process is left.

Without that report node 0 says nothing until its deadline's timer ends its launcher (the report then lands in the
deadline's last seconds): reclaimed first, it is a preemption, and the finished job would be relaunched.

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
dist.destroy_process_group()
if rank == 1:  # a slow end (its last outputs written out, say), on node 1 only: node 0 is reclaimed meanwhile
    give_up = time.monotonic() + 600
    while not release.exists() and time.monotonic() < give_up:
        time.sleep(0.05)
print(f"rank {rank}: exits", flush=True)
"""
TORCHRUN = ("torchrun --nnodes=$RUNNER_NUM_NODES --node-rank=$RUNNER_NODE_RANK --nproc-per-node=1 "
            "--master-addr=$RUNNER_MASTER_ADDR --master-port=$RUNNER_MASTER_PORT")
TIMER = "the deadline nears and the replacement is not ready: emergency checkpoint now"
REPORTED = "the controller has this node's part of the attempt as done"
ENDED = "every training process has closed; ending the launcher, left waiting at its exit"


def _job(files: Path) -> str:
    finish, release, hold, go = (files / name for name in ("finish", "release", "hold", "go"))
    # The gang's nodes run setup at once; the replacement, launched once ``hold`` exists, waits for ``go``, which
    # comes only when the test is over: the controller never says the replacement is ready.
    setup = f"if [ -e {hold} ]; then while [ ! -e {go} ]; do sleep 0.1; done; fi"
    return (f"name: node0-reclaimed-after-finishing\nsetup: {setup!r}\nrun: {TORCHRUN} train.py {finish} {release}\n"
            "resources: {cloud: [local], num_nodes: 2}\n"
            "recovery: {max_preemptions: 3, max_failures: 0, resume_drill: 'off'}\n")


def _reclaim(home: Path, node: str) -> None:
    """The cloud takes the node back now: every process of it dies at once (its notice marked it preempted)."""
    from runner.providers.local.processes import kill_node

    kill_node((home / "nodes" / node / "ref").read_text())


@pytest.mark.timeout(600)  # ~40 s alone on 2 busy cores; its waits are generous
def test_node_0_on_notice_reports_its_part_while_hosting_the_store_and_its_reclaim_ends_nothing(tmp_path):
    home, files = tmp_path / "home", tmp_path / "files"
    home.mkdir()
    files.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": 1.0, "boot_seconds": 1.0}}}))
    controller = Controller(home).start()
    runner = Runner(home)
    runner.env.update({"RUNNER_SERVER": controller.url, "RUNNER_TOKEN": controller.token})
    try:
        job_id = runner.json("submit", str(write_job(tmp_path / "job", _job(files), {"train.py": TRAINEE})))["id"]
        runner.wait_for_output(job_id, r"step 25\b", timeout=400)  # a few commits: the checkpoint's time is known
        (files / "hold").touch()
        preempted = runner("preempt", job_id, "--node", "0", "--notice", "aws")
        assert preempted.returncode == 0, preempted.stderr
        first = wait_until(lambda: (row := runner.restarts(job_id)[0]).get("standby") and row, 300,
                           "the replacement's launch")
        node0 = first["nodes"][0]["node"]

        def output() -> str:  # both nodes' output of the attempt
            return "".join(runner.output(job_id, 1, node) for node in (0, 1))

        # The job reaches its last step while the notice is trained through; rank 0 exits, rank 1 lingers.
        (files / "finish").touch()
        wait_until(lambda: len(occurrences(r"rank \d: finished at step \d+", output())) == 2, 300,
                   "every rank's last step")
        wait_until(lambda: occurrences(r"rank 0: exits", runner.output(job_id, 1, 0)), 300, "rank 0's exit")
        # Node 0's launcher now waits at its exit barrier, hosting the store. The cloud reclaims node 0 once it has
        # reported its part done (or, where it never does, once its deadline's timer has acted: the deadline's
        # last seconds, where the reclaim comes)
        wait_until(lambda: REPORTED in (events := agent_events(home, node0)) or TIMER in events, 300,
                   "node 0's report of its part, or its deadline's timer")
        assert node_alive(home, node0)
        _reclaim(home, node0)
        wait_until(lambda: (job := runner.job(job_id))["state"] != "RUNNING" or all(
            n["id"] != node0 or n["state"] != "running" for n in job.get("nodes") or []), 300,
            "the controller's finding that node 0 is gone")
        assert not (files / "release").exists() and occurrences(r"rank 1: exits", output()) == []
        (files / "release").touch()

        # (an attempt ended by node 0's loss would leave the job RECOVERING, its next attempt waiting for the
        # replacement's setup)
        job = runner.wait_for(job_id, lambda j: j["state"] != "RUNNING", timeout=400, what="the attempt's end")
        rows = runner.restarts(job_id)
        printed = output()
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

    events = agent_events(home, node0)
    assert job["state"] == "SUCCEEDED" and job["preemptions"] == 0 and job["attempts"] == 1, (job, rows, events)
    assert len(rows) == 1 and rows[0]["end_reason"] == "succeeded" and rows[0]["notice"] is not None
    assert [n["end_reason"] for n in rows[0]["nodes"]] == ["succeeded", "succeeded"]
    assert rows[0]["standby"]["outcome"] == "released"
    # Node 0 reported its part before its deadline's timer, and its launcher, hosting the store, was never ended
    assert REPORTED in events and TIMER not in events and ENDED not in events
    # No rank was stopped, signalled or relaunched: each finished, then exited by itself.
    assert "stopping at step" not in printed and "resumed from step" not in printed
    assert len(occurrences(r"rank \d: exits", printed)) == 2
