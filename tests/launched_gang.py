"""A 2-node gang launched on the in-memory market by one reconciler tick, for tests of what its nodes report."""

from __future__ import annotations

import time

from runner.providers.memory import MemoryProvider, memory_offers
from runner.scheduler.reconciler import Reconciler, SchedulerContext
from runner.spec import validate_job
from runner.spec.stored import stored_job
from runner.state import Store, open_database
from runner.state.store import NODE_RUNNING


def launched_gang(db_url: str, nodes_up: bool = False) -> tuple[Store, SchedulerContext, list]:
    """Job ``gang-1``'s attempt 1 on two nodes (``nodes_up``: their launch answered, as before they register):
    the store, the scheduler's context and the two nodes in rank order."""
    store = Store(open_database(db_url))
    market = MemoryProvider(memory_offers(("zone-a",)))
    ctx = SchedulerContext(store=store, providers={"memory": market}, controller_url="http://ctl",
                           node_token=lambda node_id: f"token-{node_id}", token_hasher=lambda t: f"hash-{t}")
    spec = validate_job({"name": "gang", "run": "train", "resources": {"num_nodes": 2},
                         "recovery": {"resume_drill": "off"}})
    with store.db.transaction() as tx:
        store.insert_job(tx, "gang-1", "gang", stored_job(spec, None), "PENDING", time.time())
    Reconciler(ctx).tick()
    (attempt,) = store.attempts("gang-1")
    if nodes_up:
        with store.db.transaction() as tx:
            for rank in attempt.nodes:
                store.update_node(tx, rank.node_id, state=NODE_RUNNING)
    return store, ctx, [store.node(n.node_id) for n in attempt.nodes]
