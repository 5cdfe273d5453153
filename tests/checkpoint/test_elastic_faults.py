"""Elastic gangs on real gloo processes, a node dying in the middle of a grow: the joiner while it receives the
state, or the survivor sending it. The other ranks must not hang nor stop: the move into the broken world fails
on every one of them at the same step (bounded by RUNNER_ELASTIC_TIMEOUT_SECONDS), and they enter the next world
the controller forms without the dead node. The harness plays the agents (tests/checkpoint/test_elastic.py).
"""

from __future__ import annotations

import signal
import socket

import pytest

from .test_elastic import STEPS, Gang, Node, equal_models, free_port, wait_until, world_sizes

pytestmark = pytest.mark.timeout(900)
# A collective waiting on a dead peer may only end at this timeout (gloo does not always see the reset); the
# default (60 s) would make the test slow, and 15 s is far more than a collective of these ranks takes.
ENV = {"RUNNER_ELASTIC_TIMEOUT_SECONDS": "15"}


def shrunk_gang(gang: Gang, die_at: dict[int, str] | None = None) -> tuple[Node, Node]:
    """Two ranks of a 3-node job training (a gang whose third node is gone), held at step 3."""
    gang.hold(3)
    port = free_port()
    nodes = []
    for rank in (0, 1):
        gang.env = {**ENV, **({"ELASTIC_TRAINEE_DIE_AT": die_at[rank]} if die_at and rank in die_at else {})}
        nodes.append(Node(gang, rank, 2, port))
    gang.nodes = nodes
    gang.held_at(nodes, 3)
    return nodes[0], nodes[1]


def joiner(gang: Gang, die_at: str | None = None) -> Node:
    gang.env = {**ENV, **({"ELASTIC_TRAINEE_DIE_AT": die_at} if die_at else {})}
    node = Node(gang, 0, 1, free_port(), join=True)
    gang.nodes.append(node)
    return node


def grow(nodes: list[Node], generation: int) -> None:
    port = free_port()
    for node_rank, node in enumerate(nodes):
        if node.proc.poll() is not None:  # it stopped instead of waiting for this world: fail now, not at a timeout
            raise AssertionError(f"rank {node_rank} of generation {generation} exited {node.proc.returncode} before "
                                 f"it was told of it:\n{node.proc.stderr.read()[-3000:]}")
        node.world(generation, node_rank, len(nodes), port)


def killed(node: Node) -> None:
    wait_until(lambda: node.proc.poll() is not None, "the rank to be killed")
    assert node.proc.returncode == -9


@pytest.fixture
def gang(tmp_path):
    made = Gang(tmp_path)
    yield made
    made.close()


def test_a_joiner_killed_while_it_receives_the_state_leaves_the_survivors_training_in_the_next_world(gang):
    """Generation 1 adds a joiner, which dies (SIGKILL) after the state's header, before its tensors. The sending
    survivor and the other one both give up generation 1 at the same step, enter generation 2 (the two of them,
    as the controller forms it once the joiner's node is gone) and train to the end in the same processes."""
    a, b = shrunk_gang(gang)
    dead = joiner(gang, die_at="recv:3")
    grow([a, b, dead], 1)
    gang.hold(8)
    killed(dead)
    grow([a, b], 2)
    gang.finish([a, b])

    lines = {n: gang.lines(n) for n in (a, b)}
    for node in (a, b):
        assert {line["pid"] for line in lines[node]} == {node.proc.pid}
        assert lines[node][-1]["step"] == STEPS and not any(line["stop"] for line in lines[node])
    changes = world_sizes(lines[a])
    assert [w for _, w in changes] == [2] and world_sizes(lines[b]) == changes  # one step for both
    assert [m["generation"] for m in a.received("world_changed")] == [2]
    assert equal_models(gang.model(a), gang.model(b))


def test_a_survivor_killed_while_it_sends_the_state_leaves_the_joiner_to_get_it_from_the_other(gang):
    """Generation 1 adds a joiner; the survivor sending it the state dies (SIGKILL) after the header. The joiner's
    restore() does not fail: it waits for generation 2 (the other survivor and itself), gets the state there and
    trains to the end beside the survivor, which kept its process."""
    a, b = shrunk_gang(gang, die_at={0: "send:3"})
    new = joiner(gang)
    grow([a, b, new], 1)
    gang.hold(8)
    killed(a)
    grow([b, new], 2)
    gang.finish([b, new])

    lines = {n: gang.lines(n) for n in (b, new)}
    assert {line["pid"] for line in lines[b]} == {b.proc.pid}
    (change,) = world_sizes(lines[b])
    assert change[1] == 2 and not any(line["stop"] for line in lines[b])
    assert new.received("restored")[0]["step"] == change[0]  # from the survivor left: its own folder is empty
    assert lines[new][0]["step"] == change[0] + 1 and lines[new][-1]["step"] == STEPS
    assert equal_models(gang.model(b), gang.model(new))


def test_a_joiner_killed_right_after_it_joined_leaves_the_survivors_training_in_the_next_world(gang):
    """The joiner dies (SIGKILL) as soon as its restore() returned: the survivors, which moved to generation 1 with
    it, rebuild DDP over a group with a dead member (DDP's constructor must not raise in the user's code), fail
    their next collective, and go on in generation 2 without it."""
    a, b = shrunk_gang(gang)
    dead = joiner(gang, die_at="restored")
    grow([a, b, dead], 1)
    gang.hold(8)
    killed(dead)
    wait_until(lambda: a.received("world_changed"), "the survivors to reach generation 1", [a.proc, b.proc])
    grow([a, b], 2)
    gang.finish([a, b])

    lines = {n: gang.lines(n) for n in (a, b)}
    for node in (a, b):
        assert {line["pid"] for line in lines[node]} == {node.proc.pid}
        assert lines[node][-1]["step"] == STEPS and not any(line["stop"] for line in lines[node])
    assert [w for _, w in world_sizes(lines[a])] == [3, 2] and world_sizes(lines[b]) == world_sizes(lines[a])
    assert [m["generation"] for m in a.received("world_changed")] == [1, 2]
    assert equal_models(gang.model(a), gang.model(b))


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_a_member_lost_before_it_enters_the_shrunk_world_leaves_the_others_to_the_next_one(gang):
    """Ranks 1 and 2 of 3 vanish together; the controller first names generation 1 (ranks 0 and 1: it has seen
    one loss), then generation 2 (rank 0 alone). Rank 0, waiting in generation 1 for a rank that never comes,
    gives it up after RUNNER_ELASTIC_TIMEOUT_SECONDS and trains on alone in generation 2, in the same process."""
    gang.env = dict(ENV)
    a, b, c = gang.start(3, gate=3)
    gang.held_at([a, b, c], 3)
    for node in (b, c):
        node.proc.send_signal(signal.SIGKILL)
        killed(node)
    port = free_port()
    a.world(1, 0, 2, port)
    gang.hold(8)
    wait_until(lambda: listening(port), "rank 0 to host generation 1's store", [a.proc])
    grow([a], 2)
    gang.finish([a])

    lines = gang.lines(a)
    assert {line["pid"] for line in lines} == {a.proc.pid}
    assert [w for _, w in world_sizes(lines)] == [1] and lines[-1]["step"] == STEPS
    assert not any(line["stop"] for line in lines)
    assert [m["generation"] for m in a.received("world_changed")] == [2]


def test_a_survivor_whose_state_transfer_broke_half_way_does_not_train_on_it(gang):
    """After a loss the lowest survivor broadcasts its state to the other, and dies (SIGKILL) doing so: the other's
    tensors may be half overwritten, so in the next world (itself alone) it counts as holding no state, and it
    stops (the job recovers from its last checkpoint) instead of training on a mix of two replicas."""
    gang.hold(3)
    port = free_port()
    gang.env = {**ENV, "ELASTIC_TRAINEE_DIE_AT": "broadcast:3"}
    a = Node(gang, 0, 3, port)
    gang.env = dict(ENV)
    b, c = Node(gang, 1, 3, port), Node(gang, 2, 3, port)
    gang.nodes = [a, b, c]
    gang.held_at([a, b, c], 3)
    c.proc.send_signal(signal.SIGKILL)
    killed(c)
    grow([a, b], 1)
    gang.hold(8)
    killed(a)
    grow([b], 2)
    gang.finish([b])

    last = gang.lines(b)[-1]
    assert last["stop"] and last["reason"] == "lost" and not any(line["changed"] for line in gang.lines(b))
    assert [m["reason"] for m in b.received("stopping")] == ["lost"]
