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
