"""A node is found by its token's hash, read fresh each time (nothing remembered serves a stale row)."""

from __future__ import annotations

import time

import pytest

from runner.state import Store, open_database
from stored import job_spec, offer as make_offer

OFFER = make_offer(cloud="memory", region="mem", zone="mem-a", spot_price=0.01, on_demand_price=0.05)


def test_a_token_finds_its_node_with_its_current_state(db_url):
    """Looked up twice around a state change, the second answer has the new state; an unknown hash finds nothing."""
    store = Store(open_database(db_url))
    with store.db.transaction() as tx:
        store.insert_job(tx, "j1", "job", job_spec(), "PENDING", time.time())
        store.insert_node(tx, "n1", "j1", 1, "memory", "hash-1", OFFER, True, time.time())
    assert store.node_by_token_hash("hash-1").state == "launching"
    with store.db.transaction() as tx:
        store.update_node(tx, "n1", state="terminated")
    assert store.node_by_token_hash("hash-1").state == "terminated"
    assert store.node_by_token_hash("hash-2") is None


def test_a_heartbeat_view_reads_the_node_its_job_and_whether_its_attempt_runs(db_url):
    """On both databases: the node's fields, the job's state and cancel, and ``attempt_current`` turning false
    once the attempt ends or a newer one starts; an unknown hash finds nothing."""
    store = Store(open_database(db_url))
    now = time.time()
    with store.db.transaction() as tx:
        store.insert_job(tx, "j1", "job", job_spec(), "RUNNING", now)
        store.insert_attempt(tx, "j1", "n1", OFFER, True, 0, now)
        store.insert_node(tx, "n1", "j1", 1, "memory", "hash-1", OFFER, True, now)
    view = store.heartbeat_views(["hash-1"])["hash-1"]
    assert (view["id"], view["job_id"], view["attempt"], view["state"], view["job_state"]) == \
        ("n1", "j1", 1, "launching", "RUNNING")
    assert view["attempt_current"] is True and view["attempt_spot"] is True and view["cancel_requested"] is None
    with store.db.transaction() as tx:
        store.request_cancel(tx, "j1", now)
        store.insert_attempt(tx, "j1", "n2", OFFER, False, 0, now)
    views = store.heartbeat_views(["hash-1", "hash-2"])  # many beats in one read; an unknown hash finds nothing
    view = views["hash-1"]
    assert view["cancel_requested"] == pytest.approx(now) and view["attempt_current"] is False
    assert list(views) == ["hash-1"]
