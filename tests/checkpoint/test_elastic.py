"""Elastic gangs on real gloo processes: the survivors of a lost node go on in a smaller group, a replacement
joins and receives the state from a peer; same processes, one pass over the epoch's samples.

Each rank is its own process and "node" (node_rank = rank); the harness plays each node's agent with the
agent's control server, sending the ``world`` messages a controller would. Nothing waits on a clock: the
harness holds the ranks at a step (a gate file) and acts when they are there.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from agents.control import ControlServer
from runner.checkpoint import ResumableSampler

from .elastic_trainee import Indexed, build

TRAINEE = Path(__file__).with_name("elastic_trainee.py")
SAMPLES = 48
STEPS = 14
TIMEOUT = 600  # generous: a busy 2-core machine starts processes slowly; no assertion depends on it
pytestmark = pytest.mark.timeout(1200)  # torch on three or four processes, twice, on a busy machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, what: str, procs=(), timeout: float = TIMEOUT):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        for proc in procs:
            if proc.poll() not in (None, 0):
                raise AssertionError(f"a rank exited {proc.returncode} while waiting for {what}:\n"
                                     f"{proc.stderr.read()[-4000:] if proc.stderr else ''}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Node:
    """One rank's process and the agent's control server it talks to."""

    def __init__(self, gang: "Gang", rank: int, world: int, port: int, join: bool = False) -> None:
        self.messages: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        self.server = ControlServer(gang.tmp / f"control-{gang.count}.sock", self.messages.put).start()
        gang.count += 1
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "RUNNER_CONTROL": str(self.server.path), "RUNNER_NUM_NODES": "3",
               "RUNNER_MIN_NODES": "1", **gang.env}
        if join:
            env["RUNNER_ELASTIC_JOIN"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, str(TRAINEE), "--steps", str(gang.steps), "--local-dir", str(gang.tmp / f"local{rank}"),
             "--report", str(gang.tmp / "report"), "--out", str(gang.tmp / "model"), "--gate", str(gang.gate),
             "--dump", str(gang.tmp / "state")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def received(self, op: str) -> list[dict]:
        while True:
            try:
                self.seen.append(self.messages.get_nowait())
            except queue.Empty:
                return [m for m in self.seen if m.get("op") == op]

    def send(self, message: dict) -> None:
        wait_until(lambda: self.server.trainees(), "the rank to connect", [self.proc])
        assert self.server.send(message) == 1

    def world(self, generation: int, node_rank: int, nnodes: int, port: int) -> None:
        self.send({"op": "world", "generation": generation, "node_rank": node_rank, "nnodes": nnodes,
                   "master_addr": "127.0.0.1", "master_port": port})


class Gang:
    def __init__(self, tmp: Path, steps: int = STEPS, env: dict | None = None) -> None:
        self.tmp, self.steps, self.env, self.count = tmp, steps, env or {}, 0
        self.gate = tmp / "gate"
        self.nodes: list[Node] = []

    def start(self, ranks: int, gate: int | None) -> list[Node]:
        self.hold(gate)
        port = free_port()
        self.nodes = [Node(self, rank, ranks, port) for rank in range(ranks)]
        return self.nodes

    def hold(self, step: int | None) -> None:
        self.gate.write_text(str(step if step is not None else 10**9))

    def held_at(self, nodes, step: int) -> None:
        def there():
            return all(Path(f"{self.gate}.{n.proc.pid}").is_file()
                       and Path(f"{self.gate}.{n.proc.pid}").read_text() == str(step) for n in nodes)
        wait_until(there, f"ranks held at step {step}", [n.proc for n in nodes])

    def finish(self, nodes) -> None:
        self.hold(None)
        for node in nodes:
            try:
                node.proc.wait(TIMEOUT)
            finally:
                node.proc.kill()
            err = node.proc.stderr.read()
            assert node.proc.returncode == 0, f"rank exited {node.proc.returncode}:\n{err[-5000:]}"

    def close(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait()
            node.server.close()

    def lines(self, node: Node) -> list[dict]:
        path = self.tmp / f"report.{node.proc.pid}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    def model(self, node: Node) -> dict:
        return torch.load(self.tmp / f"model.{node.proc.pid}.pt")

    def state_at(self, node: Node, step: int) -> dict:
        """The registered state the rank held right after the change of world at ``step`` (or, on a joining
        process, right after restore())."""
        return torch.load(self.tmp / f"state.{node.proc.pid}.{step}.pt")


@pytest.fixture
def gang(tmp_path):
    made = Gang(tmp_path)
    yield made
    made.close()


def world_sizes(lines: list[dict]) -> list[tuple[int, int]]:
    """(step, world) at each change, as the rank saw it."""
    return [(line["step"], line["world"]) for line in lines if line["changed"]]


def equal_models(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def bitwise_equal(a, b) -> bool:
    """Trees equal to the bit: tensors of the same dtype and shape with the same bytes."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and sorted(a, key=str) == sorted(b, key=str) and all(bitwise_equal(a[k], b[k])
                                                                                      for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(bitwise_equal(x, y) for x, y in zip(a, b))
    return a == b


def replay(lines: list[dict]) -> dict:
    """The weights a run should end with that trained, at each step, on the batches its report lines name:
    DDP's mean of every rank's gradient, one optimizer step. Equal (to rounding) when no change of world lost
    or repeated a step's work and every replica got the same state."""
    model, optimizer = build()
    dataset = Indexed()
    for step in sorted({line["step"] for line in lines}):
        batches = [line["indices"] for line in lines if line["step"] == step]
        optimizer.zero_grad()
        for batch in batches:
            x, y = dataset.x[batch], dataset.y[batch]
            (torch.nn.functional.mse_loss(model(x), y) / len(batches)).backward()
        optimizer.step()
    return model.state_dict()


def distance(a: dict, b: dict) -> float:
    return float(sum((a[k].double() - b[k].double()).square().sum() for k in a) ** 0.5)


@pytest.fixture
def uninterrupted() -> dict:
    """The final weights of the same 3-rank run with no change of world, trained here as the gang trains it:
    each of the 3 ranks' samplers hands out its batches (a new epoch when one runs out), and each step is DDP's
    mean of their gradients (``replay``). Equal to rounding to the gang's own run, with no process to start."""
    dataset = Indexed()
    loaders = [DataLoader(dataset, batch_size=2, sampler=ResumableSampler(dataset, shuffle=True, seed=3,
                                                                          num_replicas=3, rank=rank))
               for rank in range(3)]
    batches = [iter(loader) for loader in loaders]
    lines = []
    for step in range(1, STEPS + 1):
        for rank, loader in enumerate(loaders):
            try:
                index = next(batches[rank])[2]
            except StopIteration:  # as elastic_trainee.py: a new iterator starts the next epoch
                batches[rank] = iter(loader)
                index = next(batches[rank])[2]
            lines.append({"step": step, "indices": index.tolist()})
    return replay(lines)


def test_shrink_by_notice_then_grow_back(gang, tmp_path, uninterrupted):
    """3 -> 2 at an agreed step (the leaving node's notice comes after), then a replacement joins and gets the
    state from a survivor: survivors keep their processes, every replica ends identical, and the epoch's
    samples are each trained once across the changes."""
    a, b, c = gang.start(3, gate=3)
    gang.held_at([a, b, c], 3)
    port = free_port()
    # Both survivors get the same new world (one store, hosted by the new rank 0).
    for node, node_rank in ((a, 0), (b, 1)):
        node.world(1, node_rank, 2, port)
    gang.hold(8)
    wait_until(lambda: a.received("world_changed"), "the survivors to change world", [a.proc, b.proc])
    c.send({"op": "checkpoint", "reason": "notice", "stop": True, "deadline": time.time() + 60})
    c.proc.wait(TIMEOUT)
    assert c.proc.returncode == 0, c.proc.stderr.read()[-4000:]
    gang.held_at([a, b], 8)
    joiner = Node(gang, 0, 1, free_port(), join=True)
    gang.nodes.append(joiner)
    port = free_port()
    for node, node_rank in ((a, 0), (b, 1), (joiner, 2)):
        node.world(2, node_rank, 3, port)
    gang.finish([a, b, joiner])

    lines = {n: gang.lines(n) for n in (a, b, c, joiner)}
    shrink = a.received("world_changed")[0]
    assert shrink["generation"] == 1 and shrink["world_size"] == 2
    grow = [m for m in a.received("world_changed") if m["generation"] == 2]
    assert grow and grow[0]["world_size"] == 3
    for node in (a, b):  # the same processes all along, seeing the same changes at the same steps
        assert {line["pid"] for line in lines[node]} == {node.proc.pid}
        assert world_sizes(lines[node]) == [(shrink["step"], 2), (grow[0]["step"], 3)]
    assert not any(line["changed"] for line in lines[joiner])
    assert lines[joiner][0]["step"] == grow[0]["step"] + 1 and lines[joiner][-1]["step"] == STEPS
    assert lines[c][-1]["stop"] and lines[c][-1]["step"] == shrink["step"]
    assert equal_models(gang.model(a), gang.model(b)) and equal_models(gang.model(a), gang.model(joiner))
    assert joiner.received("restored")[0]["step"] == grow[0]["step"]  # from a peer: its own folder is empty
    # At each change every rank holds the same state, to the bit: the survivors of the notice (nothing moved
    # between them) and the joiner (model, optimizer moments, sampler place and extra from a survivor).
    assert bitwise_equal(gang.state_at(a, shrink["step"]), gang.state_at(b, shrink["step"]))
    at_join = gang.state_at(a, grow[0]["step"])
    assert at_join["optimizer"]["state"] and at_join["extra"]["samples_seen"] > 0
    assert bitwise_equal(at_join, gang.state_at(b, grow[0]["step"]))
    assert bitwise_equal(at_join, gang.state_at(joiner, grow[0]["step"]))
    # Every step's work counted once: the weights are those of the steps the ranks report, replayed here.
    everyone = [line for node in lines for line in lines[node]]
    expected = replay(everyone)
    assert all(torch.allclose(gang.model(a)[k], expected[k], rtol=0, atol=1e-5) for k in expected)
    # Not the uninterrupted run's weights (five steps averaged two ranks' gradients instead of three, over other
    # batches), but close: within a fifth of the distance the training moved them (about a tenth, on this data).
    moved = distance(uninterrupted, build()[0].state_dict())
    assert distance(gang.model(a), uninterrupted) <= 0.2 * moved
    # One pass over the epoch: every sample once, bar the padding of the last stretch (< its world size).
    epoch0 = Counter(i for node in lines for line in lines[node] if line["epoch"] == 0 for i in line["indices"])
    assert set(epoch0) == set(range(SAMPLES))
    assert sum(epoch0.values()) - SAMPLES < 3


def test_vanished_ranks_leave_through_the_failed_collective_twice(gang):
    """SIGKILL one rank of three: the survivors' next collective fails inside DDP's backward without raising,
    they move to the world the controller names (2 ranks), and after a second loss (1 rank) the last one
    trains on to the end, in the same process."""
    a, b, c = gang.start(3, gate=3)
    gang.held_at([a, b, c], 3)
    c.proc.send_signal(signal.SIGKILL)
    c.proc.wait()
    port = free_port()
    for node, node_rank in ((a, 0), (b, 1)):
        node.world(1, node_rank, 2, port)
    gang.hold(7)
    gang.held_at([a, b], 7)
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait()
    a.world(2, 0, 1, free_port())
    gang.finish([a])

    lines = gang.lines(a)
    assert {line["pid"] for line in lines} == {a.proc.pid}
    changes = world_sizes(lines)
    assert [w for _, w in changes] == [2, 1]
    assert changes[0][0] == 4 and changes[1][0] == 8  # the step of the first collective after each loss
    # The step trained on local gradients left the two replicas apart; the change made them one again.
    assert bitwise_equal(gang.state_at(a, 4), gang.state_at(b, 4))
    assert [m["world_size"] for m in a.received("world_changed")] == [2, 1]
    assert lines[-1]["step"] == STEPS and not lines[-1]["stop"]


def test_a_loss_with_no_new_world_stops_the_survivors(tmp_path):
    """Fewer nodes left than the job allows: the controller names no new world; the survivors stop (the job
    then recovers from its last checkpoint) instead of hanging or raising."""
    gang = Gang(tmp_path, env={"RUNNER_ELASTIC_WAIT_SECONDS": "2"})
    try:
        a, b, c = gang.start(3, gate=3)
        gang.held_at([a, b, c], 3)
        c.proc.send_signal(signal.SIGKILL)
        c.proc.wait()
        gang.finish([a, b])
        for node in (a, b):
            last = gang.lines(node)[-1]
            assert last["stop"] and last["reason"] == "lost" and last["step"] == 4
            assert [m["reason"] for m in node.received("stopping")] == ["lost"]
    finally:
        gang.close()
