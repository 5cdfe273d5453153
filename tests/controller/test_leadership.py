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
