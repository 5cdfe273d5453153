"""The ledger's rows (runner/state/ledger.py): start phases per node and per attempt, step times, node spans;
read back through the restart log's JSON (runner/wire.py) as the API shows it."""

from __future__ import annotations

import time

import pytest

from runner import wire
from runner.state import Store, ledger, open_database
from runner.state.gangs import GangStore
from stored import job_spec, offer as make_offer

OFFER = make_offer(instance_type="sim-t4")


@pytest.fixture
def store(db_url) -> Store:
    return Store(open_database(db_url))


def _job(store: Store, job_id: str, num_nodes: int = 1) -> float:
    now = time.time() - 100
    with store.db.transaction() as tx:
        store.insert_job(tx, job_id, job_id, job_spec(job_id, resources={"num_nodes": num_nodes}), "RUNNING", now)
        store.insert_attempt(tx, job_id, "n-0", OFFER, True, 0, now, num_nodes=num_nodes)
        for rank in range(num_nodes if num_nodes > 1 else 0):
            GangStore(store).add(tx, job_id, 1, rank, f"n-{rank}", OFFER, True)
    return now


def test_a_gangs_attempt_shows_its_slowest_node_and_each_nodes_own(store):
    """Per node rank in ``nodes``; the attempt's boot, setup and restore are the slowest node's."""
    _job(store, "gang", num_nodes=2)
    with store.db.transaction() as tx:
        for rank, boot, setup, restore in ((0, 30.0, 2.0, 1.5), (1, 45.5, 1.0, 4.25)):
            ledger.record_start_phase(tx, "gang", 1, rank, "boot_seconds", boot, keep_first=True)
            ledger.record_start_phase(tx, "gang", 1, rank, "setup_seconds", setup)
            ledger.record_start_phase(tx, "gang", 1, rank, "restore_seconds", restore)
        ledger.record_start_phase(tx, "gang", 1, 1, "boot_seconds", 0.0, keep_first=True)  # registers again
    (row,) = wire.restart_rows(store.attempts("gang"))
    assert (row["boot_seconds"], row["setup_seconds"], row["restore_seconds"]) == (45.5, 2.0, 4.25)
    assert [(n["rank"], n["boot_seconds"], n["setup_seconds"], n["restore_seconds"]) for n in row["nodes"]] == [
        (0, 30.0, 2.0, 1.5), (1, 45.5, 1.0, 4.25)]
    assert row["gap_seconds"] is None  # the first attempt


def test_a_single_node_keeps_its_first_boot_and_its_slowest_restore(store):
    """A second registration does not overwrite the boot; a second process's restore counts if slower."""
    _job(store, "solo")
    with store.db.transaction() as tx:
        ledger.record_start_phase(tx, "solo", 1, 0, "boot_seconds", 12.5, keep_first=True)
        ledger.record_start_phase(tx, "solo", 1, 0, "boot_seconds", 0.0, keep_first=True)
        ledger.record_start_phase(tx, "solo", 1, 0, "restore_seconds", 0.5)
        ledger.record_start_phase(tx, "solo", 1, 0, "restore_seconds", 0.25)
    (row,) = wire.restart_rows(store.attempts("solo"))
    assert (row["boot_seconds"], row["setup_seconds"], row["restore_seconds"]) == (12.5, None, 0.5)
    with pytest.raises(ValueError, match="unknown start phase"):
        with store.db.transaction() as tx:
            ledger.record_start_phase(tx, "solo", 1, 0, "lunch_seconds", 1.0)


def test_the_first_and_last_steps_keep_the_earliest_and_the_newest_whatever_the_order(store):
    """A retried report that arrives late moves neither the first step back nor the last step back."""
    started = _job(store, "steps")
    with store.db.transaction() as tx:
        ledger.record_steps(tx, "steps", 1, first=(1, started + 10), last=(50, started + 20))
        ledger.record_steps(tx, "steps", 1, first=(3, started + 11), last=(30, started + 15))  # an older report
        ledger.record_steps(tx, "steps", 1, last=(60, started + 22))
    (attempt,) = store.attempts("steps")
    assert (attempt.first_step, attempt.first_step_at) == (1, started + 10)
    assert (attempt.last_step, attempt.last_step_at) == (60, started + 22)


def test_node_spans_are_every_node_of_the_job_from_launch_to_release(store):
    """Released nodes with their release time, live ones with None; other jobs' nodes are not counted, nor is a node
    whose launch the cloud refused (it never ran)."""
    now = _job(store, "spans")
    _job(store, "other")
    with store.db.transaction() as tx:
        store.insert_node(tx, "a", "spans", 1, "local", "h1", OFFER, True, now)
        store.insert_node(tx, "b", "spans", 1, "local", "h2", OFFER, True, now + 5)
        store.insert_node(tx, "c", "other", 1, "local", "h3", OFFER, True, now)
        store.insert_node(tx, "refused", "spans", 2, "local", "h4", OFFER, True, now + 40)
        store.update_node(tx, "a", provider_ref="ref-a", launched_at=now, state="terminated", terminated_at=now + 30)
        store.update_node(tx, "refused", state="terminated", terminated_at=now + 45)
    assert ledger.node_spans(store.db, "spans") == [(now, now + 30), (now + 5, None)]
