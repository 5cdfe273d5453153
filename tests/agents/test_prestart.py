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


def test_a_gang_node_waits_for_every_local_rank(tmp_path):
    """Under torchrun each local rank says ``waiting``: the node waits once all of them do, not at the first."""
    ahead = _prestarted(tmp_path, "sleep 600")
    try:
        ahead.on_control({"op": "waiting", "pid": 11, "local_ranks": 2})
        assert not ahead.waiting.is_set()
        ahead.on_control({"op": "waiting", "pid": 11, "local_ranks": 2})  # the same rank again counts once
        assert not ahead.waiting.is_set()
        ahead.on_control({"op": "waiting", "pid": 12, "local_ranks": 2})
        assert ahead.waiting.is_set()
    finally:
        ahead.discard(1)


def test_a_process_started_for_another_gang_is_not_adopted(tmp_path):
    """Started ahead on a rendezvous port the attempt did not keep (a node's start ahead failed): not adopted, so
    the job starts anew on every node of the gang."""
    gang = {"num_nodes": 2, "node_rank": 0, "node_ips": ["10.0.0.1", "10.0.0.2"], "master_addr": "10.0.0.1",
            "master_port": 29600, "gpus_per_node": 1}
    output = DeferredOutput(io.BytesIO())
    tail = OutputTail(output)
    supervisor = Supervisor("sleep 600", str(tmp_path), dict(os.environ), tail)
    supervisor.start()
    ahead = Prestarted(supervisor, 2, output, tail, gang=gang)
    sent = []
    try:
        other_port = {"attempt": 2, "gang": {**gang, "master_port": 29601}, "checkpoint": {}}
        assert ahead.adopt(other_port, io.BytesIO(), sent.append, 7) is False
        assert ahead.adopt({"attempt": 2, "gang": gang, "checkpoint": {}}, io.BytesIO(), sent.append, 7) is True
        ahead.on_control({"op": "waiting", "pid": 5})
        assert sent and sent[-1]["op"] == "resume" and sent[-1]["step"] == 7
    finally:
        ahead.discard(1)
