"""A replacement's process started ahead counts as ready only once it waits in restore()."""

from __future__ import annotations

import io
import os
import threading

from agents.failure_kind import OutputTail
from agents.prestart import DeferredOutput, Prestarted
from agents.supervisor import Supervisor


def _prestarted(tmp_path, command: str) -> Prestarted:
    output = DeferredOutput(io.BytesIO())
    tail = OutputTail(output)
    supervisor = Supervisor(command, str(tmp_path), dict(os.environ), tail)
    supervisor.start()
    return Prestarted(supervisor, 2, output, tail)


def test_ready_waits_for_the_process_to_say_waiting(tmp_path):
    """Still importing: not ready. Once it says ``waiting``: ready, and the wait returns True."""
    ahead = _prestarted(tmp_path, "sleep 600")
    try:
        result = []
        waiter = threading.Thread(target=lambda: result.append(ahead.wait_in_restore(600, lambda: False)))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive()  # no word from the process yet
        ahead.on_control({"op": "waiting", "pid": 1})
        waiter.join(30)
        assert result == [True]
    finally:
        ahead.discard(1)


def test_a_process_that_exits_before_restore_ends_the_wait(tmp_path):
    ahead = _prestarted(tmp_path, "exit 3")
    assert ahead.wait_in_restore(600, lambda: False) is False


def test_a_node_no_longer_needed_ends_the_wait(tmp_path):
    ahead = _prestarted(tmp_path, "sleep 600")
    try:
        assert ahead.wait_in_restore(600, lambda: True) is False
    finally:
        ahead.discard(1)


def test_the_wait_is_bounded(tmp_path):
    """A process that never reaches restore() does not keep the node from being ready for ever."""
    ahead = _prestarted(tmp_path, "sleep 600")
    try:
        assert ahead.wait_in_restore(0.2, lambda: False) is False
    finally:
        ahead.discard(1)
