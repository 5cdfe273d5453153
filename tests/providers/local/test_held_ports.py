"""The simulated nodes' rendezvous ports are held from the moment they are chosen until their node listens: every
node is this machine, and a port merely found free could be taken by another process's socket before a node's
launcher (seconds later, its imports done) listens on it; the launcher would then fail with EADDRINUSE."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys

import pytest

from runner.providers.local import LocalProvider
from runner.providers.local.ports import HeldPorts


def _bind_plainly(port: int) -> None:
    """Bind as another program would (no SO_REUSEADDR, as an outgoing connection's socket or a plain server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", port))


def test_a_rendezvous_port_is_refused_to_other_sockets_and_open_to_the_nodes_store(tmp_path):
    provider = LocalProvider(tmp_path)
    port = provider.rendezvous_port()
    with pytest.raises(OSError) as refused:
        _bind_plainly(port)
    assert refused.value.errno == errno.EADDRINUSE
    # The node's launcher, in a process of its own, listens there (torch's TCPStore, as torchrun and an elastic
    # world's rank 0 make it) and is reached.
    script = ("import sys, datetime, torch.distributed as dist\n"
              "port = int(sys.argv[1])\n"
              "server = dist.TCPStore('127.0.0.1', port, 2, True, timeout=datetime.timedelta(seconds=60), "
              "wait_for_workers=False)\n"
              "server.set('hello', 'node')\n"
              "client = dist.TCPStore('127.0.0.1', port, 2, False, timeout=datetime.timedelta(seconds=60))\n"
              "print(client.get('hello').decode())\n")
    done = subprocess.run([sys.executable, "-c", script, str(port)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "node"


def test_the_next_port_differs_from_the_previous_one_and_both_stay_held(tmp_path):
    provider = LocalProvider(tmp_path)
    first = provider.rendezvous_port()
    second = provider.rendezvous_port(previous=first)
    assert second != first
    for port in (first, second):
        with pytest.raises(OSError):
            _bind_plainly(port)


def test_a_hold_ends_after_its_time_and_the_oldest_goes_past_the_cap():
    expiring = HeldPorts("127.0.0.1", hold_seconds=0.0)
    old = expiring.take()
    expiring.take(avoid=old)  # the next take ends the holds whose time is up
    assert old not in expiring.held()
    _bind_plainly(old)  # free again

    capped = HeldPorts("127.0.0.1", max_held=2)
    ports = [capped.take() for _ in range(3)]
    assert capped.held() == ports[1:]
    _bind_plainly(ports[0])
    capped.close()
    expiring.close()
    for port in ports[1:]:
        _bind_plainly(port)
