"""On Postgres a report group and a log group send their COMMIT with their last statement (runner/state/db.py
``Tx.all_in_savepoint_then_commit``): two round trips a group. What that must not weaken: a report or chunk the
database refuses loses only its own write and the others commit; a COMMIT that fails fails every request of the
group with nothing stored; the measurements table is still folded when it is over its bound."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from types import SimpleNamespace

import pytest

from runner.controller import log_api
from runner.controller.event_api import ReportRequest, record_reports
from runner.controller.group_commit import GroupCommit, GroupCommitFailed
from runner.controller.log_api import ChunkRequest, store_chunks
from runner.controller.metrics import FOLD_SLACK_DIVISOR, MAX_MEASUREMENTS, StateCollector
from runner.state import DatabaseError, Store, open_database
from runner.state.db import PostgresDatabase
from runner.state.logs import DatabaseLogStore
from prometheus_client import CollectorRegistry

from database_probes import round_trips
from stored import job_spec, offer as make_offer

OFFER = make_offer(cloud="memory", region="mem", zone="mem-a", spot_price=0.01, on_demand_price=0.05)
NODES = ("one", "two", "three", "bad")


@pytest.fixture
def db(postgres):
    """Jobs j-one, j-two, j-three and j-bad, each with attempt 1 on its node (token hash ``hash-<node>``), on one
    pooled connection (whose round trips a trace counts)."""
    url = postgres.new_database(migrated=True)
    db = PostgresDatabase(url, pool_size=1)
    store = Store(db)
    now = time.time()
    with db.transaction() as tx:
        for node in NODES:
            store.insert_job(tx, f"j-{node}", node, job_spec(), "RUNNING", now)
            store.insert_attempt(tx, f"j-{node}", node, OFFER, True, 0, now)
            store.insert_node(tx, node, f"j-{node}", 1, "memory", f"hash-{node}", OFFER, True, now)
    yield db
    db.close()
    postgres.drop_database(url)


def _state(db) -> SimpleNamespace:
    return SimpleNamespace(store=Store(db), logs=DatabaseLogStore(db), admin_token="admin",
                           scheduler=SimpleNamespace(nudge=threading.Event(), providers={}))


def _checkpoint(node: str, step: int, seconds: float = 0.5) -> ReportRequest:
    body = {"kind": "checkpoint", "data": {"step": step, "durable": True, "seconds": seconds, "manifest": f"m{step}"}}
    return ReportRequest(f"hash-{node}", json.dumps(body).encode())


def _report_group(state, requests):
    """The report lane's transaction (runner/controller/app.py); each report's answer, or its error's name."""
    with state.store.db.transaction() as tx:
        outcomes = record_reports(state, tx, requests)
    return [value[0]["accepted"] if ok else type(value).__name__ for ok, value in outcomes]


def _log_group(state, requests):
    """A log lane's transaction: each chunk's next offset, or its error's name."""
    with state.store.db.transaction(serialized=False) as tx:
        outcomes = store_chunks(state, tx, requests)
    return [value["offset"] if ok else type(value).__name__ for ok, value in outcomes]


def _steps(db) -> dict[str, int]:
    return {row["id"]: row["step"] for row in db.query("SELECT id, step FROM jobs ORDER BY id")}


def _measured(db) -> int:
    return db.query("SELECT COUNT(*) AS n FROM measurements")[0]["n"]


def test_a_report_group_takes_two_round_trips(db):
    """BEGIN with the write lock and the callers' nodes; then the group's checkpoints in one statement with its
    savepoint and the COMMIT. Every acknowledged report is stored."""
    state = _state(db)
    assert _report_group(state, [_checkpoint("one", 1)]) == [True]  # a controller's first group learns the table's size
    answers = []
    assert round_trips(db, lambda db: answers.append(
        _report_group(state, [_checkpoint(node, 2) for node in ("one", "two", "three")]))) == 2
    assert answers == [[True, True, True]]
    assert _steps(db) == {"j-bad": 0, "j-one": 2, "j-three": 2, "j-two": 2}
    assert _measured(db) == 4


def test_a_log_group_takes_two_round_trips(db):
    """The callers' nodes and their streams' sizes; then the chunks' INSERT with its savepoint and the COMMIT."""
    state = _state(db)
    answers = []
    assert round_trips(db, lambda db: answers.append(_log_group(state, [ChunkRequest("hash-one", 0, b"hello\n"),
                                                                        ChunkRequest("hash-two", 0, b"world\n")]))) == 2
    assert answers == [[6, 6]]
    assert (state.logs.read("j-one", 1), state.logs.read("j-two", 1)) == (b"hello\n", b"world\n")


_REFUSE_BAD = ["CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
               "IF {condition} THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$",
               "CREATE TRIGGER refuse_bad BEFORE {event} ON {table} FOR EACH ROW EXECUTE FUNCTION refuse_bad()"]
# Raised at COMMIT, once the group's statements all succeeded.
_REFUSE_BAD_AT_COMMIT = ["CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                         "IF {condition} THEN RAISE EXCEPTION 'refused at commit'; END IF; RETURN NULL; "
                         "END $$",
                         "CREATE CONSTRAINT TRIGGER refuse_bad AFTER {event} ON {table} DEFERRABLE INITIALLY DEFERRED "
                         "FOR EACH ROW EXECUTE FUNCTION refuse_bad()"]


def _install(db, statements, table: str = "", event: str = "", condition: str = "") -> None:
    with db.transaction() as tx:
        for statement in statements:
            tx.execute(statement.format(table=table, event=event, condition=condition))


def test_a_checkpoint_or_chunk_the_database_refuses_loses_only_its_own_write(db):
    """The group's statement fails (the pipeline stops before its COMMIT): it is undone, each report or chunk is
    written again alone in the transaction still open, and all but the refused one commit."""
    state = _state(db)
    assert _report_group(state, [_checkpoint("one", 1)]) == [True]
    _install(db, _REFUSE_BAD, "jobs", "UPDATE", "NEW.id = 'j-bad'")
    assert _report_group(state, [_checkpoint("two", 5), _checkpoint("bad", 5), _checkpoint("three", 5)]) == \
        [True, "RaiseException", True]
    assert _steps(db) == {"j-bad": 0, "j-one": 1, "j-three": 5, "j-two": 5}
    assert _measured(db) == 3  # j-one's and the two kept; not the refused one's

    _install(db, ["DROP TRIGGER refuse_bad ON jobs", "DROP FUNCTION refuse_bad"])
    _install(db, _REFUSE_BAD, "log_chunks", "INSERT", "NEW.job_id = 'j-bad'")
    assert _log_group(state, [ChunkRequest("hash-one", 0, b"kept\n"), ChunkRequest("hash-bad", 0, b"refused\n"),
                              ChunkRequest("hash-two", 0, b"kept too\n")]) == [5, "RaiseException", 9]
    assert [state.logs.read(f"j-{node}", 1) for node in ("one", "bad", "two")] == [b"kept\n", b"", b"kept too\n"]


def test_a_chunk_whose_start_another_controller_took_is_stored_after_it(db, postgres, monkeypatch):
    """Another controller stored a stream's next chunk after this group read the stream's size: the batch's INSERT,
    sent with the COMMIT, fails on that start before committing, and the chunks are appended one by one, only
    what is new."""
    state = _state(db)
    state.logs.append("j-one", 1, 0, b"one\n")
    other = open_database(db.url)
    read = log_api.nodes_and_log_sizes

    def read_then_another_commits(tx, token_hashes):
        found = read(tx, token_hashes)
        DatabaseLogStore(other).append("j-one", 1, 4, b"two\n")
        return found

    monkeypatch.setattr(log_api, "nodes_and_log_sizes", read_then_another_commits)
    assert _log_group(state, [ChunkRequest("hash-one", 4, b"two\nthree\n"), ChunkRequest("hash-two", 0, b"x\n")]) \
        == [14, 2]
    other.close()
    assert (state.logs.read("j-one", 1), state.logs.read("j-two", 1)) == (b"one\ntwo\nthree\n", b"x\n")


@pytest.mark.parametrize("lane", ["reports", "logs"])
def test_a_commit_that_fails_fails_every_request_of_the_group_and_stores_none(db, lane):
    """Every statement succeeded and the COMMIT sent with the last one is refused: every request of the group is
    answered with that failure, nothing of the group is kept, and the lane's next group commits. (The database
    refuses every write of the test's requests, whichever groups the lane makes of them.)"""
    state = _state(db)
    assert _report_group(state, [_checkpoint("one", 1)]) == [True]
    if lane == "reports":
        _install(db, _REFUSE_BAD_AT_COMMIT, "jobs", "UPDATE", "NEW.step = 7")
        commits = GroupCommit(db.transaction, "test-report-commits",
                              write_group=functools.partial(record_reports, state))
        requests = [_checkpoint("two", 7), _checkpoint("bad", 7), _checkpoint("three", 7)]
    else:
        _install(db, _REFUSE_BAD_AT_COMMIT, "log_chunks", "INSERT", "NEW.job_id <> 'j-one'")
        commits = GroupCommit(lambda: db.transaction(serialized=False), "test-log-commits",
                              write_group=functools.partial(store_chunks, state))
        requests = [ChunkRequest("hash-two", 0, b"two\n"), ChunkRequest("hash-bad", 0, b"bad\n"),
                    ChunkRequest("hash-three", 0, b"three\n")]

    async def send(requests):
        return await asyncio.gather(*(commits.run(request) for request in requests), return_exceptions=True)

    try:
        answers = asyncio.run(send(requests))
        assert all(isinstance(answer, GroupCommitFailed) for answer in answers), answers
        assert "refused at commit" in str(answers[1])
        assert _steps(db) == {"j-bad": 0, "j-one": 1, "j-three": 0, "j-two": 0}
        assert _measured(db) == 1
        assert [state.logs.read(f"j-{node}", 1) for node in ("two", "bad", "three")] == [b""] * 3
        again = _checkpoint("two", 8) if lane == "reports" else ChunkRequest("hash-one", 0, b"1\n")
        assert asyncio.run(send([again])) == [({"accepted": True}, None) if lane == "reports" else {"offset": 2}]
    finally:
        commits.stop()
    assert (_steps(db)["j-two"], state.logs.read("j-one", 1)) == ((8, b"") if lane == "reports" else (0, b"1\n"))


def test_a_failed_commit_is_raised_even_where_the_caller_caught_it(db):
    """A caller that catches the COMMIT's error (as a report's own) cannot go on in autocommit: every later statement
    and the transaction's end raise it, and nothing is kept."""
    _install(db, _REFUSE_BAD_AT_COMMIT, "jobs", "UPDATE", "NEW.id = 'j-bad'")
    with pytest.raises(DatabaseError, match="commit failed and nothing of this transaction was stored"):
        with db.transaction() as tx:
            tx.execute("UPDATE jobs SET step = 3 WHERE id = 'j-one'")
            with pytest.raises(Exception, match="refused at commit"):
                tx.all_in_savepoint_then_commit("UPDATE jobs SET step = 3 WHERE id = 'j-bad' RETURNING id")
            with pytest.raises(DatabaseError, match="commit failed"):
                tx.execute("UPDATE jobs SET step = 4 WHERE id = 'j-two'")
    assert _steps(db) == {"j-bad": 0, "j-one": 0, "j-three": 0, "j-two": 0}


def test_the_measurements_are_still_folded_when_over_their_bound(db):
    """Rows written elsewhere (another controller) take the table over its bound while a group commits with its
    statement: the next group folds it back, and the histogram still counts every observation."""
    state = _state(db)
    bound = MAX_MEASUREMENTS + MAX_MEASUREMENTS // FOLD_SLACK_DIVISOR
    with db.transaction() as tx:
        tx.execute("INSERT INTO measurements (key, job_id, attempt, time, name, labels, value) SELECT 'old-' || g, "
                   "'j-one', 1, g, 'checkpoint_commit_seconds', '{\"emergency\": \"false\"}', 0.5 "
                   "FROM generate_series(1, ?) AS g", (MAX_MEASUREMENTS - 1,))
    assert _report_group(state, [_checkpoint("one", 1)]) == [True]  # learns the size: MAX_MEASUREMENTS
    with db.transaction() as tx:  # another controller's reports
        tx.execute("INSERT INTO measurements (key, job_id, attempt, time, name, labels, value) SELECT 'other-' || g, "
                   "'j-two', 1, 1e10 + g, 'checkpoint_commit_seconds', '{\"emergency\": \"false\"}', 0.5 "
                   "FROM generate_series(1, ?) AS g", (bound - MAX_MEASUREMENTS,))
    assert round_trips(db, lambda db: _report_group(state, [_checkpoint("two", 2)])) == 2
    assert _measured(db) == bound + 1  # committed with its statement: over the bound until the next group
    assert _report_group(state, [_checkpoint("three", 3)]) == [True]
    assert _measured(db) == MAX_MEASUREMENTS
    registry = CollectorRegistry()
    registry.register(StateCollector(db))
    assert registry.get_sample_value("runner_checkpoint_commit_seconds_count", {"emergency": "false"}) == bound + 2
