"""Elastic gangs (``resources.min_nodes`` below ``num_nodes``): the reconciler against the in-memory provider and
a real database (SQLite, then Postgres). A lost node shrinks the world while enough survive (the attempt goes
on); its replacement is launched into the same attempt and joins once registered and set up; too few survivors
fall back to ending the attempt as for any gang."""

from __future__ import annotations

import time

import pytest

from runner.providers.memory import MemoryProvider, memory_offers
from runner.scheduler import elastic
from runner.scheduler.reconciler import Reconciler, SchedulerContext
from runner.scheduler.states import RUNNING
from runner.scheduler.transitions import transition
from runner.spec import validate_job
from runner.spec.stored import stored_job
from runner.state import Store, open_database
from runner.state.elastic import ElasticStore
from runner.state.gangs import GangStore
from runner.protocol.actions import Action
from runner.wire import restart_row

STOP_FOR_PEER, WORLD = Action.STOP_FOR_PEER, Action.WORLD

JOB = "elastic-1"


@pytest.fixture
def world(db_url):
    def build(num_nodes=3, min_nodes=2, max_preemptions=50):
        store = Store(open_database(db_url))
        market = MemoryProvider(memory_offers(("zone-a", "zone-b")))
        ctx = SchedulerContext(store=store, providers={"memory": market}, controller_url="http://ctl",
                               node_token=lambda node_id: f"token-{node_id}", token_hasher=lambda t: f"hash-{t}")
        spec = validate_job({"name": "elastic", "run": "train",
                             "resources": {"num_nodes": num_nodes, "min_nodes": min_nodes},
                             "recovery": {"resume_drill": "off", "max_preemptions": max_preemptions}})
        with store.db.transaction() as tx:
            store.insert_job(tx, JOB, "elastic", stored_job(spec, None), "PENDING", time.time())
        reconciler = Reconciler(ctx)
        reconciler.tick()
        register(store, range(num_nodes))
        return store, market, reconciler
    return build


def register(store: Store, ranks) -> None:
    """The ranks' agents register (as the register endpoint records it); the gang is RUNNING once all have."""
    gangs, now = GangStore(store), time.time()
    attempt = store.current_attempt(JOB).attempt
    with store.db.transaction() as tx:
        for rank in ranks:
            gangs.register(tx, JOB, attempt, rank, f"10.0.0.{rank}", now)
        store.mark_attempt_running(tx, JOB, attempt, now)
        if store.job(JOB, tx).state == "PROVISIONING":
            transition(tx, JOB, RUNNING, now=now, message="running")


def view(store: Store, node_id: str) -> dict:
    node = store.node(node_id)
    return {"id": node.id, "job_id": node.job_id, "attempt": node.attempt}


def node_of(store: Store, rank: int) -> str:
    return next(r.node_id for r in store.current_attempt(JOB).nodes if r.rank == rank)


def test_a_lost_node_shrinks_the_world_and_the_attempt_goes_on(world):
    """Rank 1 vanishes: the attempt keeps running with ranks 0 and 2 as generation 1 (dense node ranks, the
    rendezvous on rank 0's address at a fresh port), each survivor is told, the lost node is told to stop, a
    replacement is launched into the same attempt in the survivors' zone, and the loss counts as a preemption."""
    store, market, reconciler = world()
    first = store.current_attempt(JOB)
    lost = node_of(store, 1)
    market.lose(lost)
    reconciler.tick()
    current = store.current_attempt(JOB)
    assert current.attempt == first.attempt and store.job(JOB).state == "RUNNING"
    (generation,) = ElasticStore(store).worlds(JOB, current.attempt)
    assert generation.generation == 1 and generation.ranks == (0, 2)
    assert generation.master_addr == "10.0.0.0" and generation.master_port != first.master_port
    # ``lost``: the ranks cut the old group's connections at once (a vanished machine sends no reset)
    assert elastic.heartbeat_world(store, view(store, node_of(store, 2)), 0) == (
        WORLD, {"generation": 1, "node_rank": 1, "nnodes": 2, "master_addr": "10.0.0.0",
                "master_port": generation.master_port, "lost": True})
    assert elastic.heartbeat_world(store, view(store, node_of(store, 0)), 1) is None  # known already
    assert elastic.heartbeat_world(store, view(store, lost), 0) == (STOP_FOR_PEER, None)
    rows = {r.rank: r for r in current.nodes}
    assert rows[1].end_reason == "lost" and rows[1].left_at is not None
    assert rows[3].joined_at is not None and rows[3].zone == "zone-a" and rows[3].node_id in market.alive()
    assert store.job(JOB).preemptions == 1
    assert lost in market.terminate_calls or store.node(lost).state in ("terminating", "terminated")


def test_the_replacement_joins_as_the_next_generation_once_set_up_and_its_training_waits(world):
    """Generation 2 adds the replacement after the survivors, once its agent has registered and run setup and its
    training processes have connected (they wait for the world: the survivors must not wait for their start); its
    agent is given the job as a gang of one to launch, and RUNNER_ELASTIC_JOIN through ``elastic_join``."""
    store, market, reconciler = world()
    market.lose(node_of(store, 1))
    reconciler.tick()
    replacement = node_of(store, 3)
    register(store, (3,))
    reconciler.tick()
    assert len(ElasticStore(store).worlds(JOB, store.current_attempt(JOB).attempt)) == 1  # setup not done yet
    with store.db.transaction() as tx:
        store.record_setup(tx, replacement, time.time(), time.time())
    reconciler.tick()
    assert len(ElasticStore(store).worlds(JOB, store.current_attempt(JOB).attempt)) == 1  # its training not up yet
    with store.db.transaction() as tx:
        store.record_heartbeats(tx, [(replacement, time.time(), '{"phase": "running", "joining": true}')])
    reconciler.tick()
    # not before the survivors' training has moved to generation 1 (one not told of it yet would skip it)
    assert len(ElasticStore(store).worlds(JOB, store.current_attempt(JOB).attempt)) == 1
    assert elastic.record_world_change(store, store.node(node_of(store, 0)), 1, 50, 2, 3)
    reconciler.tick()
    current = store.current_attempt(JOB)
    worlds = ElasticStore(store).worlds(JOB, current.attempt)
    assert [w.generation for w in worlds] == [1, 2] and worlds[-1].ranks == (0, 2, 3)
    assert worlds[-1].master_port != worlds[0].master_port
    action, message = elastic.heartbeat_world(store, view(store, replacement), 0)
    assert action == WORLD and (message["generation"], message["node_rank"], message["nnodes"]) == (2, 2, 3)
    assert "lost" not in message  # a grow: the old group works, the ranks leave it at an agreed step
    assert elastic.joiner_fields(store, replacement, JOB, current.attempt, "10.0.0.3")["elastic_join"] is True
    assert elastic.joiner_fields(store, node_of(store, 0), JOB, current.attempt, "10.0.0.0") is None
    assert len(market.alive()) == 3 and current.attempt == 1


def test_a_second_loss_below_min_nodes_ends_the_attempt_as_for_any_gang(world):
    """While shrunk to 2 of 3 (min_nodes 2), losing another node leaves 1: the attempt ends lost and the job
    recovers, the next attempt keeping the survivor and the replacement, which takes a rank of the job."""
    store, market, reconciler = world()
    market.lose(node_of(store, 1))
    reconciler.tick()
    replacement = node_of(store, 3)
    market.lose(node_of(store, 2))
    reconciler.tick()
    ended, nxt = store.attempts(JOB)
    assert ended.end_reason == "lost" and nxt.attempt == 2
    assert {r.rank: r.end_reason for r in ended.nodes} == {0: "kept", 1: "lost", 2: "lost", 3: "kept"}
    assert sorted(r.rank for r in nxt.nodes) == [0, 1, 2]
    assert {r.node_id: r.rank for r in nxt.nodes}[replacement] == 1
    assert store.node(replacement).rank == 1
    row = restart_row(ended)
    assert row["world_sizes"] == [] and row["end_reason"] == "lost"


def test_a_gang_that_is_not_elastic_stops_at_the_first_loss(world):
    """min_nodes equal to num_nodes (the default): the loss ends the attempt, as before."""
    store, market, reconciler = world(min_nodes=3)
    market.lose(node_of(store, 1))
    reconciler.tick()
    assert store.attempts(JOB)[0].end_reason == "lost"
    assert ElasticStore(store).worlds(JOB, 1) == []


def test_an_exhausted_preemption_budget_falls_back_too(world):
    """The shrink counts as a preemption: with recovery.max_preemptions used up, the loss ends the attempt."""
    store, market, reconciler = world(max_preemptions=0)
    market.lose(node_of(store, 1))
    reconciler.tick()
    assert store.attempts(JOB)[0].end_reason == "lost" and store.job(JOB).state == "FAILED"


def test_world_sizes_are_recorded_once_per_generation(world):
    """Every node reports each change; the attempt keeps one entry per generation, after its starting size."""
    store, market, reconciler = world()
    node = store.node(node_of(store, 0))
    assert elastic.record_world_change(store, node, 1, 140, 2, previous_world_size=3)
    assert elastic.record_world_change(store, store.node(node_of(store, 2)), 1, 140, 2, previous_world_size=3)
    assert elastic.record_world_change(store, node, 2, 300, 3)
    assert store.current_attempt(JOB).world_sizes == [
        {"step": 0, "world_size": 3}, {"step": 140, "world_size": 2}, {"step": 300, "world_size": 3}]
    assert restart_row(store.current_attempt(JOB))["world_sizes"][1] == {"step": 140, "world_size": 2}


def test_the_reconcilers_elastic_pass_reads_only_the_jobs_running_a_gang(world, monkeypatch):
    """The pass runs at every tick: with thousands of single-node jobs running, decoding each one's job file there
    cost the controller a tenth of its CPU. It reads the jobs whose running attempt is a gang's, and finds the
    elastic ones among them."""
    store, _, _ = world()
    spec = stored_job(validate_job({"name": "single", "run": "train"}), None)
    with store.db.transaction() as tx:
        for i in range(20):
            store.insert_job(tx, f"single-{i}", "single", spec, "RUNNING", time.time())
    from runner.state import rows
    decoded = []
    load = rows.load_stored_job
    monkeypatch.setattr(rows, "load_stored_job", lambda text: decoded.append(text) or load(text))
    assert [job.id for job, _ in elastic.elastic_attempts(store)] == [JOB]
    assert len(decoded) == 1
