"""Waiting for an event a test cannot be told of directly: a check polled until it holds (never a fixed sleep)."""

from __future__ import annotations

import time


def eventually(check, what: str, timeout: float = 30.0, every: float = 0.2):
    """The first truthy result of ``check()``, polled every ``every`` seconds; fails naming ``what`` after
    ``timeout`` (a bound for a machine that is stuck, not an expectation of speed)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)
