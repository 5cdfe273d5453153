"""The agent's part in an elastic gang (agents/elastic.py): the controller's world handed to every local rank (and
to one that connects later), the generation said back only once a rank has it, each move reported once, and a
launcher left waiting for nodes that left ended once every training process has closed."""

from __future__ import annotations

import threading

from agents.elastic import ElasticWorld, LauncherWatch
from runner.protocol.environment import gang_environment

WORLD = {"generation": 1, "node_rank": 1, "nnodes": 2, "master_addr": "10.0.0.1", "master_port": 29731}


class Ranks:
    def __init__(self, connected: int = 0):
        self.connected = connected
        self.got: list[dict] = []

    def send(self, message: dict) -> int:
        self.got.append(message)
        return self.connected


def test_a_world_reaches_the_ranks_unchanged_with_its_op_and_is_known_only_once_delivered():
    ranks, reports = Ranks(connected=0), []
    world = ElasticWorld(ranks.send, reports.append)
    world.on_world(WORLD)
    assert world.delivered == 0  # no rank connected yet: the heartbeat keeps saying 0, the controller repeats it
    ranks.connected = 2
    world.on_hello({"op": "hello", "rank": 2, "world_size": 3})  # a rank connects: it gets the world
    assert ranks.got[-1] == {**WORLD, "op": "world"} and world.delivered == 1 and world.changed
    world.on_world(WORLD)  # repeated by the controller until it heard generation 1: not sent again
    assert len(ranks.got) == 2


def test_each_generation_is_reported_once_with_the_world_size_before_it():
    done = threading.Event()
    reports = []
    world = ElasticWorld(Ranks(2).send, lambda body: (reports.append(body), done.set()))
    world.on_hello({"op": "hello", "rank": 0, "world_size": 3})
    world.on_world_changed({"op": "world_changed", "generation": 1, "step": 140, "world_size": 2})
    world.on_world_changed({"op": "world_changed", "generation": 1, "step": 140, "world_size": 2})
    assert done.wait(5)
    assert reports == [{"generation": 1, "step": 140, "world_size": 2, "previous_world_size": 3}]


def test_a_launcher_waiting_for_nodes_that_left_is_ended_once_every_process_has_closed():
    world = ElasticWorld(Ranks(1).send, lambda body: None)
    stopped, closed = threading.Event(), threading.Event()
    watch = LauncherWatch(lambda: world.changed, closed.is_set, stopped.set, linger=0.1).start()
    closed.set()
    assert not stopped.wait(1.0)  # the world never changed here: a launcher's own exit is left alone
    world.on_world(WORLD)
    assert stopped.wait(5) and watch.finished_training


def test_a_joining_replacement_gets_its_variables():
    gang = {"num_nodes": 1, "node_rank": 0, "node_ips": ["10.0.0.9"], "master_addr": "10.0.0.9", "master_port": 29600,
            "gpus_per_node": 1, "elastic": True, "elastic_join": True, "min_nodes": 2}
    env = gang_environment(gang)
    assert env["RUNNER_ELASTIC_JOIN"] == "1" and env["RUNNER_MIN_NODES"] == "2" and env["RUNNER_NUM_NODES"] == "1"
    assert "RUNNER_ELASTIC_JOIN" not in gang_environment({**gang, "elastic_join": False})
