"""The reconciler with a gang job, against a provider double: all-or-none launch and the bounded rendezvous.

The provider double records launches and terminations (its nodes never boot, so the tests register
ranks themselves through the same store calls the register endpoint makes); the database is a real SQLite
file and every step is one reconciler tick.
"""

from __future__ import annotations

import time

import pytest

from runner.providers.base import NodeStatus, Provider
from runner.providers.errors import NoCapacityError
from runner.providers.offers import Offer
from runner.scheduler.reconciler import Reconciler, SchedulerContext
from runner.spec import validate_job
from runner.state import Store, open_database
from runner.state.gangs import GangStore

ZONES = ("zone-a", "zone-b")


class Market(Provider):
    """Two zones of one CPU type; ``refuse`` makes the n-th launch (1-based) fail for lack of capacity."""

    name = "local"
    describe_interval = 0.0

    def __init__(self, refuse: set[int] = frozenset()):
        self.launched: list[str] = []
        self.terminated: list[str] = []
        self.refuse = refuse

    def offers(self):
        return [Offer("local", "local", zone, "cpu-2", None, 0, 2, 4.0, 0.01 * (i + 1), 0.05)
                for i, zone in enumerate(ZONES)]

    def launch(self, request):
        if len(self.launched) + 1 in self.refuse:
            self.launched.append(None)
            raise NoCapacityError(f"no capacity in {request.offer.zone}")
        self.launched.append(request.node_id)
        return f"ref-{request.node_id}"

    def describe(self, node_id, provider_ref):
        return NodeStatus(alive=node_id not in self.terminated)

    def terminate(self, node_id, provider_ref):
        self.terminated.append(node_id)

    def rendezvous_port(self, previous=None):
        return 29600 if previous != 29600 else 29601


@pytest.fixture
def world(tmp_path):
    def build(refuse=frozenset(), gang_timeout=600.0):
        store = Store(open_database(f"sqlite:///{tmp_path / 'state.db'}"))
        market = Market(refuse)
        ctx = SchedulerContext(store=store, providers={"local": market}, controller_url="http://ctl",
                               node_token=lambda node_id: f"token-{node_id}", token_hasher=lambda t: f"hash-{t}",
                               gang_timeout=gang_timeout)
        spec = validate_job({"name": "gang", "run": "train", "resources": {"num_nodes": 2},
                             "recovery": {"resume_drill": "off"}})
        with store.db.transaction() as tx:
            store.insert_job(tx, "gang-1", "gang", spec.model_dump(), "PENDING", time.time())
        return store, market, Reconciler(ctx)
    return build


def register_all(store: Store, ranks=(0, 1)) -> None:
    gangs = GangStore(store)
    attempt = store.current_attempt("gang-1")["attempt"]
    with store.db.transaction() as tx:
        for rank in ranks:
            gangs.register(tx, "gang-1", attempt, rank, "10.0.0.%d" % rank, time.time())


def test_a_gang_is_launched_whole_in_the_cheapest_zone_as_one_attempt(world):
    """Two nodes of one attempt, ranks 0 and 1, both in the cheapest zone, with the attempt's rendezvous port."""
    store, market, reconciler = world()
    reconciler.tick()
    (attempt,) = store.attempts("gang-1")
    assert [n["rank"] for n in attempt["nodes"]] == [0, 1] and attempt["num_nodes"] == 2
    assert {n["zone"] for n in attempt["nodes"]} == {"zone-a"} and attempt["master_port"] == 29600
    assert sorted(market.launched) == sorted(n["node_id"] for n in attempt["nodes"])
    assert store.job("gang-1")["state"] == "PROVISIONING"


def test_a_gang_that_cannot_be_completed_is_taken_back_and_its_launched_node_released(world):
    """The second launch fails: no attempt remains, the first node is released, the job says why, and the
    next try launches the whole gang in the other zone."""
    store, market, reconciler = world(refuse={2})
    reconciler.tick()
    assert store.attempts("gang-1") == []
    first = market.launched[0]
    assert store.node(first)["state"] == "terminating"
    assert "could not be completed in zone-a" in store.job("gang-1")["message"]
    reconciler.tick()  # releases it, then tries again away from the refused zone (backed off)
    assert first in market.terminated
    (attempt,) = store.attempts("gang-1")
    assert {n["zone"] for n in attempt["nodes"]} == {"zone-b"} and store.job("gang-1")["state"] == "PROVISIONING"


def test_a_rendezvous_that_never_forms_ends_the_attempt_naming_the_node_and_replaces_only_it(world):
    """Rank 1 never registers: the attempt ends lost naming it; rank 0's node is kept into the next attempt."""
    store, market, reconciler = world(gang_timeout=0.0)
    reconciler.tick()
    first = store.attempts("gang-1")[0]
    node0, node1 = (n["node_id"] for n in first["nodes"])
    register_all(store, ranks=(0,))
    reconciler.tick()  # the wait is over: the attempt ends, rank 1's node is released, the next attempt planned
    ended, second = store.attempts("gang-1")
    assert ended["end_reason"] == "lost" and node1 in ended["message"] and "rank 1" in ended["message"]
    assert [n["end_reason"] for n in ended["nodes"]] == ["kept", "lost"]
    assert second["attempt"] == 2 and second["nodes"][0]["node_id"] == node0
    assert second["nodes"][1]["node_id"] not in (node0, node1) and second["nodes"][1]["zone"] == "zone-a"
    assert second["master_port"] != first["master_port"]
    assert node1 in market.terminated and node0 not in market.terminated
