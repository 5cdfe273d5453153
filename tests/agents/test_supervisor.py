"""The job's command under the Supervisor: its own process group, inside the agent's session."""

from __future__ import annotations

import os
import sys
import time

from agents.supervisor import Supervisor


class Sink:
    def __init__(self):
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


def _alive(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_the_job_leads_its_own_process_group_in_the_agents_session(tmp_path):
    """The command is a new process group's leader (so it can be signalled as a group) in the agent's session."""
    sink = Sink()
    code = "import os; print(os.getpid(), os.getpgrp(), os.getsid(0))"
    supervisor = Supervisor(f"exec {sys.executable} -c '{code}'", str(tmp_path), dict(os.environ), sink)
    supervisor.start()
    assert supervisor.wait() == 0
    pid, pgid, sid = (int(n) for n in sink.data.split())
    assert pid == pgid == supervisor.pid
    assert pgid != os.getpgrp()
    assert sid == os.getsid(0)  # a power-off of the node's session (the local provider) reaches the job


def test_stop_ends_the_whole_group(tmp_path):
    """stop() ends the command and the processes it started, which would otherwise outlive it."""
    sink = Sink()
    supervisor = Supervisor("sleep 60 & echo $!; wait", str(tmp_path), dict(os.environ), sink)
    supervisor.start()
    deadline = time.monotonic() + 10
    while not sink.data.strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(sink.data.split()[0])
    supervisor.stop(grace=2.0)
    supervisor.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child)
