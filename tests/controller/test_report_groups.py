"""A group of agent reports written in one transaction (the report lane's ``write_group``,
runner/controller/event_api.py ``record_reports``), on both databases: each checkpoint comes out as it would
alone (a superseded attempt's is fenced, a job's step never goes back, the last of equal steps is kept), a report
refused or failing loses only its own write, and a group's statements do not grow with its checkpoints."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from runner.controller.event_api import ReportRequest, record_reports
from runner.protocol.events import EventKind
from runner.state import Store, open_database
from runner.state import measurements as m
from stored import job_spec, offer as make_offer

OFFER = make_offer(cloud="memory", region="mem", zone="mem-a", spot_price=0.01, on_demand_price=0.05)


@pytest.fixture
def store(db_url):
    """j1 with attempts 1 and 2 (nodes old, new); j2, j3 and jbad with attempt 1 (nodes two, three, bad); j3 already
    holds step 100; node gone is terminated."""
    store = Store(open_database(db_url))
    now = time.time()
    with store.db.transaction() as tx:
        for job in ("j1", "j2", "j3", "jbad"):
            store.insert_job(tx, job, job, job_spec(), "RUNNING", now)
            store.insert_attempt(tx, job, f"{job}-n", OFFER, True, 0, now)
        store.insert_attempt(tx, "j1", "j1-n2", OFFER, True, 0, now)
        for node, job, attempt in (("old", "j1", 1), ("new", "j1", 2), ("two", "j2", 1), ("three", "j3", 1),
                                   ("bad", "jbad", 1), ("gone", "j2", 1)):
            store.insert_node(tx, node, job, attempt, "memory", f"hash-{node}", OFFER, True, now)
        store.update_node(tx, "gone", state="terminated")
        store.record_checkpoint(tx, "j3", 1, {"step": 100, "manifest": "j3-100"})
    yield store
    store.db.close()


def _state(store) -> SimpleNamespace:
    return SimpleNamespace(store=store, admin_token="admin",
                           scheduler=SimpleNamespace(nudge=threading.Event(), providers={}))


def _checkpoint(node: str, step, manifest: str, seconds: float | None = None) -> ReportRequest:
    data = {"step": step, "durable": True, "manifest": manifest}
    if seconds is not None:
        data["seconds"] = seconds
    return ReportRequest(f"hash-{node}", json.dumps({"kind": "checkpoint", "data": data}).encode())


def _write_group(store, requests: list[ReportRequest], tx_wrapper=lambda tx: tx) -> list:
    with store.db.transaction() as tx:
        return record_reports(_state(store), tx_wrapper(tx), requests)


def _answer(outcome):
    ok, value = outcome
    return value[0]["accepted"] if ok else getattr(value, "status_code", type(value).__name__)


def _commit_seconds(store) -> list[float]:
    return sorted(row["value"] for row in m.measurements(store.db) if row["name"] == "checkpoint_commit_seconds")


def test_a_group_mixing_jobs_and_attempts_keeps_each_checkpoint_as_it_would_alone(store):
    """A superseded attempt's checkpoint is refused, a lower step is accepted but moves nothing back, the last of
    two equal steps is the one kept, reports of other kinds and refused ones in between change none of that."""
    outcomes = _write_group(store, [
        _checkpoint("new", 40, "j1-40", seconds=1.0),
        _checkpoint("old", 500, "j1-old", seconds=2.0),  # attempt 1 of j1: attempt 2 has started
        _checkpoint("new", 30, "j1-30", seconds=3.0),
        ReportRequest("hash-two", json.dumps({"kind": EventKind.TELEMETRY, "data": {"steps": 7}}).encode()),
        _checkpoint("two", 10, "j2-10a", seconds=4.0),
        _checkpoint("gone", 900, "j2-gone"),  # a terminated node's token: 401
        _checkpoint("two", 10, "j2-10b", seconds=5.0),  # the same step again: this one is kept, measured once
        _checkpoint("two", "abc", "j2-abc"),  # not a step: 422
        _checkpoint("two", 5, "j2-5"),
        _checkpoint("three", 50, "j3-50"),  # j3 holds step 100 already
    ])
    assert [_answer(o) for o in outcomes] == [True, False, True, True, True, 401, True, 422, True, True]
    jobs = {job: store.job(job) for job in ("j1", "j2", "j3")}
    assert {job: (row.step, row.checkpoint["manifest"]) for job, row in jobs.items()} == {
        "j1": (40, "j1-40"), "j2": (10, "j2-10b"), "j3": (100, "j3-100")}
    assert jobs["j1"].checkpoint["attempt"] == 2
    steps = {(a.job_id, a.attempt): a.checkpoint_step for job in ("j1", "j2", "j3") for a in store.attempts(job)}
    assert steps == {("j1", 1): None, ("j1", 2): 40, ("j2", 1): 10, ("j3", 1): 100}
    assert _commit_seconds(store) == [1.0, 3.0, 4.0]  # not the fenced one's, the repeated step's once
    assert store.attempts("j2")[0].steps == 7


def test_a_checkpoint_whose_write_fails_loses_only_its_own(store, backend):
    """The database refuses one job's update: that report is answered with the error, the others are kept."""
    with store.db.transaction() as tx:
        for statement in _REFUSE_JBAD[backend]:
            tx.execute(statement)
    outcomes = _write_group(store, [_checkpoint("two", 20, "j2-20", seconds=1.0),
                                    _checkpoint("bad", 20, "jbad-20", seconds=2.0),
                                    _checkpoint("new", 60, "j1-60", seconds=3.0)])
    assert [o[0] for o in outcomes] == [True, False, True]
    assert [store.job(job).step for job in ("j2", "jbad", "j1")] == [20, 0, 60]
    assert _commit_seconds(store) == [1.0, 3.0]


_REFUSE_JBAD = {
    "sqlite": ["CREATE TRIGGER refuse_jbad BEFORE UPDATE ON jobs WHEN NEW.id = 'jbad' "
               "BEGIN SELECT RAISE(ABORT, 'refused'); END"],
    "postgres": ["CREATE FUNCTION refuse_jbad() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "IF NEW.id = 'jbad' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$",
                 "CREATE TRIGGER refuse_jbad BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_jbad()"],
}


class CountingTx:
    """A transaction that counts the statements sent through it (a savepoint is two: taken and released)."""

    def __init__(self, tx):
        self.tx, self.statements = tx, 0

    def __getattr__(self, name):
        method = getattr(self.tx, name)
        if name in ("execute", "execute_many", "one", "all", "all_in_savepoint", "all_in_savepoint_then_commit"):
            self.statements += 1
        return method

    @contextmanager
    def savepoint(self):
        self.statements += 2
        with self.tx.savepoint():
            yield self


def test_a_group_of_checkpoints_takes_as_many_statements_as_one_checkpoint(store):
    """On Postgres every statement is a round trip: a group of ten checkpoints costs what one costs, not ten times."""
    statements = []
    for steps in ([1], range(2, 12)):
        counting: list[CountingTx] = []
        outcomes = _write_group(store, [_checkpoint(("new", "two", "bad")[step % 3], step, f"s{step}", seconds=0.5)
                                        for step in steps],
                                tx_wrapper=lambda tx: counting.append(CountingTx(tx)) or counting[-1])
        assert all(_answer(o) is True for o in outcomes)
        statements.append(counting[0].statements)
    assert [store.job(job).step for job in ("j1", "j2", "jbad")] == [9, 10, 11]
    assert statements[1] == statements[0], statements
