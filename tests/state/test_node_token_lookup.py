"""A node is found by its token's hash, read fresh each time (a remembered id never serves a stale row)."""

from __future__ import annotations

import time

from runner.state import Store, open_database

OFFER = {"cloud": "memory", "region": "mem", "zone": "mem-a", "instance_type": "cpu", "spot_price": 0.01,
         "on_demand_price": 0.05}


def test_a_token_finds_its_node_with_its_current_state(tmp_path):
    """Looked up twice around a state change, the second answer has the new state; an unknown hash finds nothing."""
    store = Store(open_database(f"sqlite:///{tmp_path / 'runner.db'}"))
    with store.db.transaction() as tx:
        store.insert_job(tx, "j1", "job", {"recovery": {}}, "PENDING", time.time())
        store.insert_node(tx, "n1", "j1", 1, "memory", "hash-1", OFFER, True, time.time())
    assert store.node_by_token_hash("hash-1")["state"] == "launching"
    with store.db.transaction() as tx:
        store.update_node(tx, "n1", state="terminated")
    assert store.node_by_token_hash("hash-1")["state"] == "terminated"
    assert store.node_by_token_hash("hash-2") is None
