"""The transition function: only the table's changes, each ending the attempt and logging an event."""

from __future__ import annotations

import time

import pytest

from runner.scheduler.outcomes import next_state
from runner.scheduler.states import ALLOWED, TERMINAL
from runner.scheduler.transitions import AttemptEnd, InvalidTransition, transition
from runner.state import Store, open_database
from runner.state.values import Notice
from stored import job_spec, offer as make_offer

OFFER = make_offer(instance_type="sim")


@pytest.fixture
def store(db_url):
    store = Store(open_database(db_url))
    with store.db.transaction() as tx:
        store.insert_job(tx, "j1", "job", job_spec(), "PENDING", time.time())
    return store


def test_every_disallowed_change_is_refused(store):
    """A change not in the table raises and leaves the state as it was."""
    with pytest.raises(InvalidTransition):
        with store.db.transaction() as tx:
            transition(tx, "j1", "SUCCEEDED", now=time.time(), message="skip ahead")
    assert store.job("j1").state == "PENDING"


def test_terminal_states_have_no_way_out():
    """SUCCEEDED, FAILED and CANCELLED are final."""
    assert all(not ALLOWED[state] for state in TERMINAL)


def test_ending_an_attempt_writes_the_restart_log_and_counts_preemptions(store):
    """The attempt's end fields and the job's counter change in the same transaction as the state."""
    with store.db.transaction() as tx:
        attempt = store.insert_attempt(tx, "j1", "n1", OFFER, True, 0, time.time())
        transition(tx, "j1", "PROVISIONING", now=time.time(), message="launch")
        transition(tx, "j1", "RUNNING", now=time.time(), message="up")
        transition(tx, "j1", "RECOVERING", now=time.time(), message="preempted",
                   attempt_end=AttemptEnd(attempt=attempt, reason="preempted", exit_code=143,
                                          notice=Notice.from_json({"source": "aws"}), checkpoint_step=12))
    (row,) = store.attempts("j1")
    assert row.end_reason == "preempted" and row.exit_code == 143 and row.notice.to_json() == {"source": "aws"}
    assert row.checkpoint_step == 12 and row.ended_at is not None
    assert store.job("j1").preemptions == 1
    assert [e.to_state for e in store.events("j1")] == ["PENDING", "PROVISIONING", "RUNNING", "RECOVERING"]


def test_an_attempt_cannot_end_twice(store):
    """Ending an attempt that already ended is refused (no double counting)."""
    with store.db.transaction() as tx:
        attempt = store.insert_attempt(tx, "j1", "n1", OFFER, True, 0, time.time())
        transition(tx, "j1", "PROVISIONING", now=time.time(), message="launch")
        transition(tx, "j1", "RECOVERING", now=time.time(), message="lost",
                   attempt_end=AttemptEnd(attempt=attempt, reason="lost"))
    with pytest.raises(InvalidTransition):
        with store.db.transaction() as tx:
            transition(tx, "j1", "FAILED", now=time.time(), message="again",
                       attempt_end=AttemptEnd(attempt=attempt, reason="lost"))
    assert store.job("j1").preemptions == 1


def test_checkpoint_from_an_older_attempt_is_fenced(store):
    """A checkpoint reported by attempt 1 after attempt 2 started is not recorded."""
    with store.db.transaction() as tx:
        store.insert_attempt(tx, "j1", "n1", OFFER, True, 0, time.time())
        store.insert_attempt(tx, "j1", "n2", OFFER, True, 0, time.time())
        assert not store.record_checkpoint(tx, "j1", 1, {"step": 50, "manifest": "old"})
        assert store.record_checkpoint(tx, "j1", 2, {"step": 40, "manifest": "new"})
    assert store.job("j1").step == 40


@pytest.mark.parametrize("reason,counters,expected", [
    ("succeeded", (0, 0), "SUCCEEDED"),
    ("failed", (0, 0), "RECOVERING"),
    ("failed", (0, 2), "FAILED"),
    ("preempted", (49, 0), "RECOVERING"),
    ("preempted", (50, 0), "FAILED"),
    ("lost", (0, 0), "RECOVERING"),
    ("cancelled", (0, 0), "CANCELLED"),
])
def test_next_state_respects_the_recovery_limits(reason, counters, expected):
    """Relaunch while within max_preemptions / max_failures, else fail."""
    state, why = next_state(reason, preemptions=counters[0], failures=counters[1], max_preemptions=50,
                            max_failures=2)
    assert state == expected and why
