"""The supervisor of `runner server --workers N` (runner/controller/supervisor.py) with stand-in workers: small
Python processes that say READY=1 through sd_notify, as a controller does, or fail to start."""

from __future__ import annotations

import os
import signal
import sys

import psutil

from runner.controller.supervisor import Supervisor

# Each stand-in reads its slot number on stdin; FAIL_SLOT exits at once with code 3, the others say they are ready
# and serve (sleep) until they are stopped.
WORKER = """
import sys, time
from runner import sdnotify
slot = int(sys.stdin.read())
if slot == int(sys.argv[1]):
    sys.exit(3)
sdnotify.ready()
time.sleep(600)
"""


def supervisor(count: int, fail_slot: int = -1, on_ready=lambda pids: None) -> Supervisor:
    return Supervisor([sys.executable, "-c", WORKER, str(fail_slot)], count, lambda n: str(n).encode(),
                      dict(os.environ), on_ready=on_ready, stop_grace=30)


def test_every_worker_ready_is_told_once_and_a_stop_ends_them_all():
    seen = []

    def ready(pids):
        seen.append([psutil.Process(pid) for pid in pids])
        os.kill(os.getpid(), signal.SIGTERM)  # the operator's SIGTERM, handled by the supervisor while it runs

    assert supervisor(3, on_ready=ready).run() == 0
    assert len(seen) == 1 and len(seen[0]) == 3
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in seen[0])


def test_a_worker_that_cannot_start_stops_the_others_and_its_exit_code_is_returned():
    """A bad setting or an unreachable database fails every start alike: the parent gives up, with the worker's
    exit code, rather than starting it again for ever, and leaves no worker running."""
    before = {p.pid for p in psutil.Process().children()}
    ready = []
    assert supervisor(3, fail_slot=1, on_ready=ready.append).run() == 3
    assert ready == []
    assert {p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE} <= before
