"""Elastic gangs on real gloo processes, a node that vanishes without a reset: its processes are frozen (SIGSTOP),
so its connections stay open and silent, as those of a machine that went away. The survivors block in a
collective with it; the world the controller forms after the loss (``lost``) must get them out at once, not at
RUNNER_ELASTIC_TIMEOUT_SECONDS (set here far beyond the test's waits). The harness plays the agents
(tests/checkpoint/test_elastic.py).
"""

from __future__ import annotations

import signal

import pytest

from .test_elastic import STEPS, Gang, Node, bitwise_equal, equal_models, free_port, wait_until, world_sizes

pytestmark = pytest.mark.timeout(900)
# A collective waiting on the frozen node would end at this timeout only: far beyond every wait of the test.
ENV = {"RUNNER_ELASTIC_TIMEOUT_SECONDS": "3600"}
# How long the survivors may take to train to the end once told: generous for a busy 2-core machine, and far
# below the collective's timeout.
FINISH_WAIT = 300


def lost_world(node: Node, generation: int, node_rank: int, nnodes: int, port: int) -> None:
    node.send({"op": "world", "generation": generation, "node_rank": node_rank, "nnodes": nnodes,
               "master_addr": "127.0.0.1", "master_port": port, "lost": True})


def finished(gang: Gang, nodes: list[Node]) -> None:
    wait_until(lambda: all(n.proc.poll() is not None for n in nodes), "the survivors to train to the end",
               [n.proc for n in nodes], timeout=FINISH_WAIT)
    for node in nodes:
        assert node.proc.returncode == 0, f"rank exited {node.proc.returncode}:\n{node.proc.stderr.read()[-5000:]}"


@pytest.fixture
def gang(tmp_path):
    made = Gang(tmp_path, env=ENV)
    yield made
    made.close()


def test_survivors_blocked_on_a_vanished_node_train_on_once_the_world_after_the_loss_comes(gang):
    """Rank 2 freezes while held at step 3; the survivors go on into step 4, whose DDP all-reduce waits on it.
    The world without it (generation 1, ``lost``) cuts the old group's connections: the all-reduce fails
    without raising, both survivors leave at step 4, take the lowest survivor's state and train to the end in
    the same processes."""
    a, b, frozen = gang.start(3, gate=3)
    gang.held_at([a, b, frozen], 3)
    frozen.proc.send_signal(signal.SIGSTOP)
    gang.hold(None)
    port = free_port()
    for node, node_rank in ((a, 0), (b, 1)):
        lost_world(node, 1, node_rank, 2, port)
    finished(gang, [a, b])

    lines = {node: gang.lines(node) for node in (a, b)}
    for node in (a, b):
        assert {line["pid"] for line in lines[node]} == {node.proc.pid}
        assert world_sizes(lines[node]) == [(4, 2)]  # the step whose collective waited on the frozen node
        assert lines[node][-1]["step"] == STEPS and not any(line["stop"] for line in lines[node])
    assert bitwise_equal(gang.state_at(a, 4), gang.state_at(b, 4))
    assert equal_models(gang.model(a), gang.model(b))
    assert [m["world_size"] for m in a.received("world_changed")] == [2]


def test_a_joiner_blocked_on_a_sender_that_vanished_enters_the_next_world(gang):
    """A survivor freezes while it sends the state to a joiner (the joiner waits in a receive that only its
    timeout would end). The next world, formed after that loss, gets the joiner and the other survivor out of the
    broken change at once; the joiner then receives the state from the other survivor and both train to the end."""
    gang.hold(3)
    port = free_port()
    gang.env = {**ENV, "ELASTIC_TRAINEE_FREEZE_AT": "send:3"}
    sender = Node(gang, 0, 2, port)
    gang.env = dict(ENV)
    other = Node(gang, 1, 2, port)
    gang.nodes = [sender, other]
    gang.held_at([sender, other], 3)
    joiner = Node(gang, 0, 1, free_port(), join=True)
    gang.nodes.append(joiner)
    port = free_port()
    for node_rank, node in enumerate((sender, other, joiner)):
        node.world(1, node_rank, 3, port)
    gang.hold(None)  # the survivors step on to the agreed step, where they enter generation 1
    wait_until(lambda: _stopped(sender.proc.pid), "the sender to freeze in its transfer", [sender.proc])
    port = free_port()
    for node_rank, node in enumerate((other, joiner)):
        lost_world(node, 2, node_rank, 2, port)
    finished(gang, [other, joiner])

    lines = {node: gang.lines(node) for node in (other, joiner)}
    assert {line["pid"] for line in lines[other]} == {other.proc.pid}
    assert lines[other][-1]["step"] == STEPS and lines[joiner][-1]["step"] == STEPS
    changes = world_sizes(lines[other])
    assert len(changes) == 1 and changes[0][1] == 2  # generation 1 was given up: one change, 2 ranks to 2
    assert lines[joiner][0]["step"] == changes[0][0] + 1  # it trained from the step the survivor had left at
    assert equal_models(gang.model(other), gang.model(joiner))


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"
