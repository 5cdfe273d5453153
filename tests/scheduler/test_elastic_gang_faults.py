"""An elastic gang's controller side when things go wrong during a change (the reconciler against the in-memory
provider and a real database, SQLite then Postgres): the replacement lost before or after it was let in, a
survivor lost during the grow, two nodes lost in one pass, a loss while a shrink is not yet taken up, a
controller that dies with a replacement's launch out, and a cancel while the gang is short of a node. Each
ends with no node left running that the job no longer needs, and the record saying why."""

from __future__ import annotations

import time

import pytest

from runner.protocol.actions import Action
from runner.scheduler import elastic
from runner.scheduler import reconciler as ticks
from runner.scheduler.reconciler import Reconciler, SchedulerContext
from runner.state import Store, open_database
from runner.state.elastic import ElasticStore
from runner.wire import restart_row

from test_elastic_gangs import JOB, node_of, register, view, world  # noqa: F401 - world is a fixture


def members(store: Store) -> list[tuple[int, ...]]:
    return [w.ranks for w in ElasticStore(store).worlds(JOB, store.current_attempt(JOB).attempt)]


def ready_to_join(store: Store, rank: int) -> str:
    """The replacement at ``rank`` registers, runs setup, and its training waits for its world."""
    node_id = node_of(store, rank)
    register(store, (rank,))
    with store.db.transaction() as tx:
        store.record_setup(tx, node_id, time.time(), time.time())
        store.record_heartbeats(tx, [(node_id, time.time(), '{"phase": "running", "joining": true}')])
    return node_id


def shrunk_then_grown(store, market, reconciler) -> str:
    """Rank 1 lost (generation 1: ranks 0 and 2), the survivors moved, replacement rank 3 let in (generation 2)."""
    market.lose(node_of(store, 1))
    reconciler.tick()
    joiner = ready_to_join(store, 3)
    assert elastic.record_world_change(store, store.node(node_of(store, 0)), 1, 50, 2, 3)
    reconciler.tick()
    assert members(store) == [(0, 2), (0, 2, 3)]
    return joiner


def gone(store: Store, market, node_id: str) -> bool:
    return node_id not in market.alive() and store.node(node_id).state in ("terminating", "terminated")


def test_a_replacement_lost_right_after_it_was_let_in_shrinks_the_world_again_and_is_replaced(world):
    """The joiner vanishes once generation 2 names it (while it receives the state, or just after): generation 3
    is the two survivors again, the attempt goes on, the dead joiner's node goes, and another replacement comes."""
    store, market, reconciler = world()
    joiner = shrunk_then_grown(store, market, reconciler)
    market.lose(joiner)
    reconciler.tick()
    current = store.current_attempt(JOB)
    assert current.attempt == 1 and store.job(JOB).state == "RUNNING"
    assert members(store)[-1] == (0, 2)
    assert elastic.heartbeat_world(store, view(store, node_of(store, 2)), 2)[1]["nnodes"] == 2
    rows = {r.rank: r for r in current.nodes}
    assert rows[3].end_reason == "lost" and rows[3].left_at is not None
    assert gone(store, market, joiner)
    assert rows[4].joined_at is not None and rows[4].node_id in market.alive()
    assert sorted(market.alive()) == sorted(rows[r].node_id for r in (0, 2, 4))


def test_a_replacement_lost_while_it_boots_is_released_and_replaced_without_a_new_world(world):
    store, market, reconciler = world()
    market.lose(node_of(store, 1))
    reconciler.tick()
    booting = node_of(store, 3)
    market.lose(booting)
    reconciler.tick()
    assert members(store) == [(0, 2)]  # nothing to tell the survivors
    assert gone(store, market, booting) and node_of(store, 4) in market.alive()
    assert store.job(JOB).state == "RUNNING"


def test_a_survivor_lost_during_the_grow_leaves_the_other_survivor_and_the_joiner(world):
    """Rank 2 vanishes while generation 2 (0, 2, 3) is being entered (it might be the one sending the state): with
    min_nodes 2, generation 3 is rank 0 and the joiner, which each hear it on their next beat."""
    store, market, reconciler = world()
    joiner = shrunk_then_grown(store, market, reconciler)
    market.lose(node_of(store, 2))
    reconciler.tick()
    assert store.current_attempt(JOB).attempt == 1 and members(store)[-1] == (0, 3)
    action, told = elastic.heartbeat_world(store, view(store, joiner), 2)
    assert action == Action.WORLD and (told["generation"], told["node_rank"], told["nnodes"]) == (3, 1, 2)
    assert store.job(JOB).preemptions == 2


def test_two_nodes_lost_in_one_pass_end_the_attempt_and_the_job_recovers(world):
    """3 nodes, min_nodes 2, two vanish at once: the gang cannot go on; the attempt ends lost naming both, the
    job recovers (from its last checkpoint) on the survivor and new nodes, and no world names a dead node."""
    store, market, reconciler = world()
    lost = [node_of(store, 1), node_of(store, 2)]
    for node_id in lost:
        market.lose(node_id)
    reconciler.tick()
    ended = store.attempts(JOB)[0]
    assert ended.end_reason == "lost" and store.current_attempt(JOB).attempt == 2
    assert {r.rank: r.end_reason for r in ended.nodes}[1] == "lost"
    assert {r.rank: r.end_reason for r in ended.nodes}[2] == "lost"
    assert all(2 not in w.ranks and 1 not in w.ranks for w in ElasticStore(store).worlds(JOB, 1)[1:])
    assert all(gone(store, market, n) for n in lost)
    assert restart_row(ended)["end_reason"] == "lost"
    alive = set(market.alive())
    assert node_of(store, 0) in alive and len(alive) == 3


def test_a_loss_while_the_shrink_is_not_yet_taken_up_skips_to_the_newest_world(world):
    """4 nodes, min_nodes 2: rank 1 lost (generation 1), then rank 2 before the training moved: generation 2 is
    ranks 0 and 3, a survivor that has not heard of generation 1 is told generation 2, and no replacement is let in
    until the training has moved to it."""
    store, market, reconciler = world(num_nodes=4)
    market.lose(node_of(store, 1))
    reconciler.tick()
    market.lose(node_of(store, 2))
    reconciler.tick()
    assert store.current_attempt(JOB).attempt == 1 and members(store) == [(0, 2, 3), (0, 3)]
    action, told = elastic.heartbeat_world(store, view(store, node_of(store, 3)), 0)
    assert action == Action.WORLD and (told["generation"], told["nnodes"]) == (2, 2)
    for rank in (4, 5):
        ready_to_join(store, rank)
    assert elastic.record_world_change(store, store.node(node_of(store, 0)), 1, 50, 3, 4)  # generation 1 only
    reconciler.tick()
    assert len(members(store)) == 2
    assert elastic.record_world_change(store, store.node(node_of(store, 0)), 2, 51, 2)
    reconciler.tick()
    assert members(store)[-1] == (0, 3, 4, 5)


@pytest.mark.parametrize("asked", [True, False], ids=["launch-asked", "launch-not-asked"])
def test_a_controller_that_dies_with_a_replacements_launch_out_leaves_the_next_one_to_launch_it_once(world, db_url,
                                                                                                    asked):
    """The leader plans the replacement (its rows written) and asks for its launch (or not yet), then dies before
    the answer is applied. Another controller on the same database finds the node launching and asks (again: the
    provider's launch is idempotent per node): one replacement, which it lets in once, in one generation."""
    store, market, first = world()
    market.lose(node_of(store, 1))
    ctx = first.ctx
    for worker in ticks.TICK_WORKERS[:ticks.TICK_WORKERS.index(ticks.grow_elastic_gangs)]:
        worker(ctx)  # the leader's tick up to the elastic pass: the loss is seen, the gang shrinks
    assert members(store) == [(0, 2)]
    (planned,) = elastic.plan_replacements(ctx, store.job(JOB), store.current_attempt(JOB))
    if asked:
        ticks._launch(ctx, store.node(planned))  # the leader dies before it applies the answer
    assert store.node(planned).state == "launching"
    follower = Reconciler(SchedulerContext(store=Store(open_database(db_url)), providers=ctx.providers,
                                           controller_url=ctx.controller_url, node_token=ctx.node_token,
                                           token_hasher=ctx.token_hasher))
    follower.tick()
    follower.tick()
    rows = store.current_attempt(JOB).nodes
    assert [r.rank for r in rows if r.joined_at is not None] == [3] and node_of(store, 3) == planned
    assert planned in market.alive() and store.node(planned).state == "running"
    assert len(set(market.alive())) == 3 and set(market.launch_calls) & set(market.alive()) >= {planned}
    ready_to_join(store, 3)
    assert elastic.record_world_change(store, store.node(node_of(store, 0)), 1, 50, 2, 3)
    follower.tick()
    follower.tick()
    assert members(store) == [(0, 2), (0, 2, 3)]


def test_a_cancel_while_short_of_a_node_releases_every_node_and_the_booting_replacement(world):
    """Cancelled with rank 1 gone and its replacement booting: the job is CANCELLED and no node is left running,
    the survivors, the replacement and the lost node alike."""
    store, market, reconciler = world()
    market.lose(node_of(store, 1))
    reconciler.tick()
    booting = node_of(store, 3)
    assert booting in market.alive()
    with store.db.transaction() as tx:
        store.request_cancel(tx, JOB, time.time())
    reconciler.tick()
    reconciler.ctx.clock = lambda: time.time() + 3600  # the agents never report: past the cancel's grace
    for _ in range(3):
        reconciler.tick()
    assert store.job(JOB).state == "CANCELLED"
    assert market.alive() == []
    assert all(store.node(r.node_id).state in ("terminating", "terminated") for r in store.attempts(JOB)[0].nodes)
    assert store.attempts(JOB)[0].end_reason == "cancelled"
