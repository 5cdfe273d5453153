"""Group commit (runner/controller/group_commit.py) on a real database, both kinds: log chunks sent from many
threads at once are each stored exactly once and in order, and answered only once stored; a request whose own
work fails is undone alone; a group whose transaction fails fails every request of it and stores none."""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager

import pytest

from runner.controller.group_commit import GroupCommit, GroupCommitFailed
from runner.state.db import open_database
from runner.state.logs import DatabaseLogStore

from database_probes import until, waiting_for_a_lock

STREAMS = 12
CHUNKS = 25


@pytest.fixture
def logs(db_url):
    db = open_database(db_url)
    try:
        yield DatabaseLogStore(db)
    finally:
        db.close()


def _chunk(stream: int, i: int) -> bytes:
    return f"stream {stream} line {i}\n".encode()


def test_chunks_sent_from_many_threads_are_each_stored_once_in_order(logs):
    commits = GroupCommit(lambda: logs.db.transaction(serialized=False), "test-log-commits")
    failures: list[BaseException] = []
    seen_before_answer: list[int] = []

    def agent(stream: int) -> None:
        """One node's shipper: one chunk at a time, each sent twice (a retry after a lost reply)."""
        async def ship():
            offset = 0
            for i in range(CHUNKS):
                data = _chunk(stream, i)
                for _ in range(2):
                    answer = await commits.run(lambda tx: logs.append_in(tx, "job", 1, offset, data, node=stream))
                    assert answer == offset + len(data)
                # acknowledged: another connection reads it now
                seen_before_answer.append(logs.size("job", 1, stream) - answer)
                offset = answer
        try:
            asyncio.run(ship())
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(STREAMS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    commits.stop()
    assert not failures, failures
    assert set(seen_before_answer) == {0}  # every answer came after its chunk was committed
    for stream in range(STREAMS):
        assert logs.read("job", 1, node=stream) == b"".join(_chunk(stream, i) for i in range(CHUNKS))


def test_a_request_that_fails_is_undone_alone_and_its_group_commits(logs):
    commits = GroupCommit(lambda: logs.db.transaction(serialized=False), "test-log-commits")
    hold, held = threading.Event(), threading.Event()

    def first(tx):
        held.set()
        hold.wait(60)  # the others queue meanwhile and share the next transaction
        return logs.append_in(tx, "job", 1, 0, b"first\n", node=0)

    def broken(tx):
        logs.append_in(tx, "job", 1, 0, b"never kept\n", node=1)
        raise ValueError("bad chunk")

    async def scenario():
        head = asyncio.ensure_future(commits.run(first))
        await asyncio.get_running_loop().run_in_executor(None, held.wait, 60)
        group = [asyncio.ensure_future(commits.run(broken))]
        group += [asyncio.ensure_future(commits.run(lambda tx, n=n: logs.append_in(tx, "job", 1, 0, b"ok\n", node=n)))
                  for n in range(2, 6)]
        await asyncio.sleep(0)
        hold.set()
        return await head, await asyncio.gather(*group, return_exceptions=True)

    try:
        head, group = asyncio.run(scenario())
    finally:
        commits.stop()
    assert head == len(b"first\n")
    assert isinstance(group[0], ValueError) and group[1:] == [3, 3, 3, 3]
    assert logs.read("job", 1, node=1) == b""
    assert [logs.read("job", 1, node=n) for n in range(2, 6)] == [b"ok\n"] * 4


def test_a_failed_transaction_fails_its_whole_group_and_stores_none_of_it(logs):
    fail = threading.Event()

    @contextmanager
    def transaction():
        with logs.db.transaction(serialized=False) as tx:
            yield tx
            if fail.is_set():
                raise ConnectionError("server closed the connection")  # before the commit: all rolled back

    commits = GroupCommit(transaction, "test-log-commits")
    hold, held = threading.Event(), threading.Event()

    def first(tx):
        held.set()
        hold.wait(60)
        return logs.append_in(tx, "job", 1, 0, b"first\n", node=0)

    async def scenario():
        head = asyncio.ensure_future(commits.run(first))
        await asyncio.get_running_loop().run_in_executor(None, held.wait, 60)
        group = [asyncio.ensure_future(commits.run(lambda tx, n=n: logs.append_in(tx, "job", 1, 0, b"lost\n", node=n)))
                 for n in range(1, 6)]
        await asyncio.sleep(0)
        fail.set()  # the first group is already in its transaction; the one after it fails
        hold.set()
        return await asyncio.gather(head, *group, return_exceptions=True)

    try:
        answers = asyncio.run(scenario())
    finally:
        commits.stop()
    # the first request's group failed too (the flag was set before it committed): every request of each
    # failed group is told, and nothing of them is stored
    assert all(isinstance(answer, GroupCommitFailed) for answer in answers), answers
    assert "none was stored" in str(answers[1]) and "server closed the connection" in str(answers[1])
    assert [logs.read("job", 1, node=n) for n in range(6)] == [b""] * 6
    fail.clear()
    assert asyncio.run(GroupCommit(transaction, "again").run(
        lambda tx: logs.append_in(tx, "job", 1, 0, b"sent again\n", node=1))) == len(b"sent again\n")
    assert logs.read("job", 1, node=1) == b"sent again\n"


def test_a_group_never_waits_for_a_pooled_connection_that_writers_waiting_on_it_hold(db_url, backend):
    """The deadlock found at 2,000 nodes: every other pooled connection belongs to a writer that waits for what the
    group's open transaction holds; a read made by the group's work (a node's token looked up without the open
    transaction, as it once was) must not wait for a connection of the pool, or nothing ever moves again."""
    if backend == "sqlite":
        pytest.skip("SQLite keeps one connection a thread: there is no pool to run out of")
    from runner.state.db import PostgresDatabase
    from runner.state.store import Store

    db = PostgresDatabase(db_url, pool_size=3, pool_timeout=15)
    store = Store(db)
    commits = GroupCommit(db.transaction, "test-report-commits")
    writers_done: list[int] = []

    def writer(n: int) -> None:  # a pooled connection each, then a wait for the group's uncommitted row
        with db.transaction(serialized=False) as tx:
            tx.execute("INSERT INTO controller_secrets (name, value) VALUES (?, ?) ON CONFLICT DO NOTHING",
                       ("report", f"writer {n}"))
        writers_done.append(n)

    def report(tx):
        tx.execute("INSERT INTO controller_secrets (name, value) VALUES (?, ?)", ("report", "kept"))
        writers = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(2)]
        for thread in writers:
            thread.start()
        until(lambda: waiting_for_a_lock(db) >= 2, "the writers never queued behind the group's row")
        # reads without the transaction: served on the group's own connection, seeing its write
        return store.node_by_token_hash("no-such-token"), db.query("SELECT value FROM controller_secrets "
                                                                   "WHERE name = 'report'"), writers

    async def scenario():
        return await asyncio.wait_for(commits.run(report), 60)

    try:
        node, read, writers = asyncio.run(scenario())
        for thread in writers:
            thread.join(60)
    finally:
        commits.stop()
        db.close()
    assert node is None and read == [{"value": "kept"}]
    assert sorted(writers_done) == [0, 1]  # and the writers went on once the group committed


def test_a_transaction_inside_a_transaction_on_one_thread_is_refused(db_url):
    """On both databases a thread has one connection: a nested transaction is an error, never a second one."""
    db = open_database(db_url)
    try:
        with db.transaction() as tx:
            with pytest.raises(Exception, match="transaction"):
                with db.transaction():
                    pass
            tx.execute("INSERT INTO controller_secrets (name, value) VALUES (?, ?)", ("outer", "kept"))
        assert db.query("SELECT value FROM controller_secrets WHERE name = 'outer'") == [{"value": "kept"}]
    finally:
        db.close()
