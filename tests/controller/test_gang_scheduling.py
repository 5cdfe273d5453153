"""The reconciler with a gang job, against the in-memory provider: all-or-none launch and the bounded rendezvous.

The provider records launches and terminations (its nodes never boot, so the tests register ranks
themselves through the same store calls the register endpoint makes); the database is a real SQLite
file and every step is one reconciler tick.
"""

from __future__ import annotations

import time

import pytest

from runner.providers.memory import MemoryProvider, memory_offers
from runner.scheduler.reconciler import Reconciler, SchedulerContext
from runner.spec import validate_job
from runner.state import Store, open_database
from runner.state.gangs import GangStore
from runner.spec.stored import stored_job

ZONES = ("zone-a", "zone-b")


@pytest.fixture
def world(db_url):
    def build(refuse_second=False, gang_timeout=600.0):
        store = Store(open_database(db_url))
        market = MemoryProvider(memory_offers(ZONES))
        if refuse_second:  # the very first gang's second launch finds its zone stocked out
            market.on_launch = lambda request: len(market.nodes) == 1 and market.refuse(request.offer.zone)
        ctx = SchedulerContext(store=store, providers={"memory": market}, controller_url="http://ctl",
                               node_token=lambda node_id: f"token-{node_id}", token_hasher=lambda t: f"hash-{t}",
                               gang_timeout=gang_timeout)
        spec = validate_job({"name": "gang", "run": "train", "resources": {"num_nodes": 2},
                             "recovery": {"resume_drill": "off"}})
        with store.db.transaction() as tx:
            store.insert_job(tx, "gang-1", "gang", stored_job(spec, None), "PENDING", time.time())
        return store, market, Reconciler(ctx)
    return build


def register_all(store: Store, ranks=(0, 1)) -> None:
    gangs = GangStore(store)
    attempt = store.current_attempt("gang-1").attempt
    with store.db.transaction() as tx:
        for rank in ranks:
            gangs.register(tx, "gang-1", attempt, rank, "10.0.0.%d" % rank, time.time())


def test_a_gang_is_launched_whole_in_the_cheapest_zone_as_one_attempt(world):
    """Two nodes of one attempt, ranks 0 and 1, both in the cheapest zone, with the attempt's rendezvous port."""
    store, market, reconciler = world()
    reconciler.tick()
    (attempt,) = store.attempts("gang-1")
    assert [n.rank for n in attempt.nodes] == [0, 1] and attempt.num_nodes == 2
    assert {n.zone for n in attempt.nodes} == {"zone-a"} and attempt.master_port == 29500
    assert market.alive() == [n.node_id for n in attempt.nodes]
    assert store.job("gang-1").state == "PROVISIONING"


def test_a_gang_that_cannot_be_completed_is_taken_back_and_its_launched_node_released(world):
    """The second launch fails: no attempt remains, the first node is released, the job says why, and the
    next try launches the whole gang in the other zone."""
    store, market, reconciler = world(refuse_second=True)
    reconciler.tick()
    assert store.attempts("gang-1") == []
    first = market.launch_calls[0]
    assert store.node(first).state == "terminating"
    assert "could not be completed in zone-a" in store.job("gang-1").message
    reconciler.tick()  # releases it, then tries again away from the refused zone (backed off)
    assert first in market.terminate_calls
    (attempt,) = store.attempts("gang-1")
    assert {n.zone for n in attempt.nodes} == {"zone-b"} and store.job("gang-1").state == "PROVISIONING"


def test_a_rendezvous_that_never_forms_ends_the_attempt_naming_the_node_and_replaces_only_it(world):
    """Rank 1 never registers: the attempt ends lost naming it; rank 0's node is kept into the next attempt."""
    store, market, reconciler = world(gang_timeout=0.0)
    reconciler.tick()
    first = store.attempts("gang-1")[0]
    node0, node1 = (n.node_id for n in first.nodes)
    register_all(store, ranks=(0,))
    reconciler.tick()  # the wait is over: the attempt ends, rank 1's node is released, the next attempt planned
    ended, second = store.attempts("gang-1")
    assert ended.end_reason == "lost" and node1 in ended.message and "rank 1" in ended.message
    assert [n.end_reason for n in ended.nodes] == ["kept", "lost"]
    assert second.attempt == 2 and second.nodes[0].node_id == node0
    assert second.nodes[1].node_id not in (node0, node1) and second.nodes[1].zone == "zone-a"
    assert second.master_port != first.master_port
    assert node1 in market.terminate_calls and node0 not in market.terminate_calls
