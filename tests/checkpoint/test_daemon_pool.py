"""The checkpoint library's thread pool (runner/checkpoint/daemon_pool.py): a ThreadPoolExecutor's results and
errors, on threads that never hold up the process's exit (tests/checkpoint/test_close_bounded.py has the exit)."""

from __future__ import annotations

import threading

import pytest

from runner.checkpoint.daemon_pool import DaemonPool, abandoned


def test_results_and_errors_come_back_through_the_futures_on_at_most_the_threads_asked_for():
    seen: set[str] = set()

    def work(n: int) -> int:
        seen.add(threading.current_thread().name)
        if n == 3:
            raise ValueError("three")
        return n * n

    with DaemonPool(2, "test-pool") as pool:
        futures = [pool.submit(work, n, what=f"task {n}") for n in range(8)]
    assert [f.result() for f in futures if f.exception() is None] == [0, 1, 4, 16, 25, 36, 49]
    with pytest.raises(ValueError, match="three"):
        futures[3].result()
    assert seen and len(seen) <= 2 and all(name.startswith("test-pool") for name in seen)
    with pytest.raises(RuntimeError):
        pool.submit(work, 1)


def test_a_task_under_way_is_named_until_it_ends_and_its_thread_is_a_daemon():
    release, started = threading.Event(), threading.Event()

    def blocked() -> None:
        started.set()
        assert threading.current_thread().daemon
        release.wait(30)

    pool = DaemonPool(1)
    future = pool.submit(blocked, what="upload of step 7 to memory://bucket/step-00000007")
    assert started.wait(30)
    assert "upload of step 7 to memory://bucket/step-00000007" in abandoned()
    release.set()
    future.result(30)
    pool.shutdown()
    assert "upload of step 7 to memory://bucket/step-00000007" not in abandoned()


def test_a_pool_needs_a_thread():
    with pytest.raises(ValueError, match="workers=0"):
        DaemonPool(0)
