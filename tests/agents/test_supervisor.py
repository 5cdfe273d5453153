"""The job's command under the Supervisor: its own process group, inside the agent's session."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from agents.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[2]


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


def test_a_command_ended_by_a_signal_exits_128_plus_its_number_as_in_a_shell(tmp_path):
    """The restart log's exit_code of a job stopped with SIGTERM is 143 (a shell's $?), not Python's -15."""
    supervisor = Supervisor("exec sleep 60", str(tmp_path), dict(os.environ), Sink())
    supervisor.start()
    supervisor.stop(grace=5.0)
    assert supervisor.wait() == 143


def _wait_for_pids(sink: Sink, count: int) -> list[int]:
    deadline = time.monotonic() + 30
    while len(sink.data.split()) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return [int(n) for n in sink.data.split()[:count]]


def test_wait_returns_once_processes_left_in_other_sessions_are_gone(tmp_path):
    """A command that exits leaving a process in a session of its own (as torchrun starts its workers), one
    that ignores SIGTERM: wait() ends it too before it returns."""
    sink = Sink()
    escapee = f"{sys.executable} -c 'import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
              "os.setsid(); print(os.getpid(), flush=True); time.sleep(600)'"
    supervisor = Supervisor(f"{escapee} & sleep 0.5; exit 0", str(tmp_path), dict(os.environ), sink)
    supervisor.start()
    (pid,) = _wait_for_pids(sink, 1)
    assert supervisor.wait() == 0
    assert not _alive(pid)


def test_stop_ends_a_process_that_left_the_group_and_was_reparented(tmp_path):
    """stop() reaches a process that left the process group and whose parent has exited (a double fork)."""
    sink = Sink()
    daemon = f"{sys.executable} -c 'import os, time; os.setsid(); print(os.getpid(), flush=True); time.sleep(600)'"
    supervisor = Supervisor(f"( {daemon} & ) ; sleep 600", str(tmp_path), dict(os.environ), sink)
    supervisor.start()
    (pid,) = _wait_for_pids(sink, 1)
    assert os.getpgid(pid) != supervisor.pid
    supervisor.stop(grace=1.0)
    supervisor.wait()
    assert not _alive(pid)


def test_the_job_gets_sigterm_when_the_agent_dies(tmp_path):
    """An agent SIGKILLed: the kernel sends the job's process SIGTERM (it was started with a parent-death
    signal from the agent's thread that forked it)."""
    import signal
    import subprocess

    agent = (f"import os, sys, time; sys.path.insert(0, {str(REPO)!r}); from agents.supervisor import Supervisor\n"
             "class Out:\n    def write(self, data): sys.stdout.buffer.write(data); sys.stdout.flush()\n"
             f"s = Supervisor('exec {sys.executable} -c \"import os, time; print(os.getpid(), flush=True); "
             "time.sleep(600)\"', '.', dict(os.environ), Out()); s.start(); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", agent], stdout=subprocess.PIPE, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        job = next(int(line) for line in parent.stdout if line.strip().isdigit())  # the agent logs to stdout too
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while _alive(job) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(job)
    finally:
        parent.kill()
