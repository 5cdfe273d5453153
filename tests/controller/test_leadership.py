"""The leader loop: the reconciler runs exactly while this controller holds the database's leader lock."""

from __future__ import annotations

import time

import psycopg
import pytest

from runner.controller.leadership import LeaderLoop
from runner.state import open_database
from runner.state.leader import Leadership


class Worker:
    def __init__(self, log: list):
        self.log = log

    def start(self) -> None:
        self.log.append("start")

    def stop(self, timeout: float = 10.0) -> None:
        self.log.append("stop")


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.sqlite_only("on SQLite there is no lock to take: a controller alone leads at once")
def test_a_controller_alone_on_sqlite_leads_from_its_first_moment(tmp_path):
    log: list = []
    loop = LeaderLoop(Leadership(open_database(f"sqlite:///{tmp_path / 'state.db'}")), lambda: Worker(log))
    loop.start()
    try:
        assert loop.leading and log == ["start"]
    finally:
        loop.stop()
    assert log == ["start", "stop"] and not loop.leading


def test_the_follower_takes_over_when_the_leader_loses_its_session(postgres):
    """A leader whose lock session is ended stops its reconciler; the follower starts its own."""
    url = postgres.new_database()
    first_log: list = []
    second_log: list = []
    first = LeaderLoop(Leadership(open_database(url)), lambda: Worker(first_log), interval=0.05)
    second = LeaderLoop(Leadership(open_database(url)), lambda: Worker(second_log), interval=0.05)
    first.start()
    second.start()
    try:
        assert first.leading and not second.leading
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted")
        wait_for(lambda: second.leading)
        wait_for(lambda: not first.leading)
        assert first_log[:2] == ["start", "stop"] and second_log == ["start"]
    finally:
        first.stop()
        second.stop()



def test_work_recorded_by_a_follower_wakes_the_leaders_reconciler(postgres):
    """The follower's nudge reaches the leader, through the database, as a wake of its reconciler; the leader's own
    nudge sends nothing (its reconciler is woken in-process)."""
    import threading

    from runner.controller.leadership import SharedNudge
    from runner.state.leader import WAKE_CHANNEL

    url = postgres.new_database()
    woken = threading.Event()
    leader_db, follower_db = open_database(url), open_database(url)
    leader = LeaderLoop(Leadership(leader_db), lambda: Worker([]), interval=0.2, on_wake=woken.set)
    follower = LeaderLoop(Leadership(follower_db), lambda: Worker([]), interval=0.2)
    leader.start()
    follower.start()
    try:
        with psycopg.connect(url, autocommit=True) as listener:
            listener.execute(f"LISTEN {WAKE_CHANNEL}")
            assert leader.leading and not follower.leading
            SharedNudge(leader_db, lambda: leader.leading).set()
            SharedNudge(follower_db, lambda: follower.leading).set()
            assert woken.wait(30)
            listener.execute(f"NOTIFY {WAKE_CHANNEL}, 'end'")  # after both sets, in commit order
            sent = []
            for notification in listener.notifies(timeout=30):
                if notification.payload == "end":
                    break
                sent.append(notification.pid)
            assert len(sent) == 1, sent  # the follower's alone
    finally:
        follower.stop()
        leader.stop()
        leader_db.close()
        follower_db.close()


def test_a_follower_tries_for_the_lock_on_one_connection_it_keeps(postgres):
    """A follower tries for the lock every election step on the same connection, not a new one each time (a
    connection a second from every follower is churn for the database), and closes it when it stops."""
    url = postgres.new_database()
    leader_db, follower_db = open_database(url), open_database(url)
    connects, tries = [], []
    connect, try_acquire = follower_db.connect, Leadership.try_acquire
    follower_db.connect = lambda: connects.append(1) or connect()
    follower_leadership = Leadership(follower_db)
    follower_leadership.try_acquire = lambda: tries.append(1) or try_acquire(follower_leadership)
    leader = LeaderLoop(Leadership(leader_db), lambda: Worker([]), interval=0.05)
    follower = LeaderLoop(follower_leadership, lambda: Worker([]), interval=0.05)
    leader.start()
    follower.start()
    try:
        wait_for(lambda: len(tries) >= 5)
        assert not follower.leading and len(connects) == 1
    finally:
        follower.stop()
        leader.stop()
    with psycopg.connect(url, autocommit=True) as admin:  # the follower's connection closed with it
        wait_for(lambda: admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                                       "pid <> pg_backend_pid() AND query LIKE '%pg_try_advisory_lock%'").fetchone()[0]
                 == 0)
    leader_db.close()
    follower_db.close()
