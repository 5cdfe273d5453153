"""The agent's end of the control channel, against real Unix socket connections."""

from __future__ import annotations

import gc
import json
import socket
import threading
import time
import weakref
from pathlib import Path

from agents.control import ControlServer


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    return sock


def _wait(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_finished_connection_leaves_nothing_behind(tmp_path: Path):
    """Once a connection (a health check, say) ends, the agent keeps no object of it, however many come and go."""
    server = ControlServer(tmp_path / "control.sock", lambda message: None).start()
    try:
        for _ in range(20):
            _connect(server.path).close()
        probe = _connect(server.path)
        probe.sendall(b'{"op": "hello", "pid": 1}\n')
        _wait(lambda: server.trainees())  # its reader is running
        readers = [weakref.ref(t) for t in threading.enumerate() if t.name == "control-read"]
        probe.close()
        _wait(lambda: gc.collect() >= 0 and all(reader() is None for reader in readers))
    finally:
        server.close()


def test_only_processes_that_said_hello_count_as_training_processes(tmp_path: Path):
    """A connection that never says hello (a health check) gets messages but is not counted as a training process."""
    server = ControlServer(tmp_path / "control.sock", lambda message: None).start()
    probe, trainee = _connect(server.path), _connect(server.path)
    try:
        trainee.sendall(json.dumps({"op": "hello", "pid": 4242, "job_id": None, "attempt": None}).encode() + b"\n")
        _wait(lambda: server.trainees())
        assert server.send({"op": "checkpoint", "reason": "rebalance", "deadline": None, "stop": False}) == 1
        assert [hello["pid"] for hello in server.trainees()] == [4242]
    finally:
        probe.close()
        trainee.close()
        _wait(lambda: not server.trainees())
        server.close()


def test_a_training_process_that_leaves_is_no_longer_counted(tmp_path: Path):
    """When a training process's connection ends, it drops out of the connected training processes."""
    server = ControlServer(tmp_path / "control.sock", lambda message: None).start()
    try:
        trainee = _connect(server.path)
        trainee.sendall(b'{"op": "hello", "pid": 7}\n')
        _wait(lambda: server.trainees())
        trainee.close()
        _wait(lambda: not server.trainees())
        assert server.send({"op": "checkpoint", "reason": "notice", "deadline": None, "stop": True}) == 0
    finally:
        server.close()


def test_a_closed_message_names_the_rank_that_said_hello_on_its_connection(tmp_path: Path):
    """``closed`` carries no rank on the wire; the agent learns whose it is from the connection's hello."""
    received: list[dict] = []
    server = ControlServer(tmp_path / "control.sock", received.append).start()
    trainee = _connect(server.path)
    try:
        trainee.sendall(b'{"op": "hello", "pid": 7, "rank": 3, "local_rank": 1}\n{"op": "closed", "step": 9}\n')
        _wait(lambda: any(m["op"] == "closed" for m in received))
        closed = next(m for m in received if m["op"] == "closed")
        assert closed["rank"] == 3 and closed["pid"] == 7 and server.training() == []
    finally:
        trainee.close()
        _wait(lambda: not server.trainees())
        server.close()
