"""Node 0's report that its part is done while its launcher still runs (agents/launcher_exit.py, RanksFinished).

The report comes once the training is over on the node and its launcher has outlived it a while (a launcher waits at
its exit barrier only when every worker of its node exited 0; one whose worker failed exits at once), and only once.
"""

from __future__ import annotations

import threading

from agents.launcher_exit import RanksFinished


def test_the_part_is_reported_once_when_the_launcher_outlives_the_finished_training():
    finished, reports = threading.Event(), []
    done = threading.Event()
    watch = RanksFinished(finished.is_set, lambda: True, lambda: (reports.append(1), done.set()), linger=0.2).start()
    assert not done.wait(1.0)  # the training is not over: nothing to report
    finished.set()
    assert done.wait(10) and watch.reported
    assert not threading.Event().wait(1.0) and reports == [1]  # once


def test_nothing_is_reported_when_the_launcher_exits_with_its_training():
    """A launcher that exits on its own (its worker failed, or every node reached its exit barrier) leaves nothing to
    report ahead: the exit report says it all."""
    running = threading.Event()
    reports = []
    watch = RanksFinished(lambda: True, running.is_set, lambda: reports.append(1), linger=0.2).start()
    assert not threading.Event().wait(1.5)
    watch.close()
    assert reports == [] and not watch.reported


def test_a_closed_watch_reports_nothing():
    finished, reports = threading.Event(), []
    watch = RanksFinished(finished.is_set, lambda: True, lambda: reports.append(1), linger=0.2).start()
    watch.close()  # the launcher exited: the attempt's exit report follows
    finished.set()
    assert not threading.Event().wait(1.0)
    assert reports == [] and not watch.reported
