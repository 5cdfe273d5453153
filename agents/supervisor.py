"""Running one shell command of the job as its own process group, with its output streamed.

When the command ends (or is stopped) every process it started ends too, wherever it went
(agents/process_tree.py): the next attempt never starts beside the last one's leftovers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import structlog

from .process_tree import MARK, die_with_parent_preexec, end_tree, members, new_mark, signal_all

log = structlog.get_logger(__name__)


def own_process_group() -> dict:
    """Popen arguments that start the child as the leader of a new process group, in the agent's session, that
    the kernel sends SIGTERM when the agent dies (process_tree.die_with_parent_preexec).

    Not a new session (``start_new_session``): the local provider powers a node off by killing every process
    of the node's session, the job's included.
    """
    return {"preexec_fn": die_with_parent_preexec(signal.SIGTERM)}


LEFTOVER_GRACE_SECONDS = 2.0  # SIGTERM to SIGKILL for processes left behind by a command that has exited


class Supervisor:
    """One child process group; ``stop()`` sends SIGTERM to the group, then SIGKILL after a grace. ``wait()``
    returns once the command has exited and every process it started is gone."""

    def __init__(self, command: str, cwd: str, env: dict[str, str], sink, end_leftovers: bool = True):
        self.command = command
        # False for the node's ``setup``: what it leaves running (a daemon the job uses) serves later attempts.
        self.ends_leftovers = end_leftovers
        self.cwd = cwd
        self.env = env
        self.sink = sink  # .write(bytes)
        self.process: subprocess.Popen | None = None
        self.stopped_by_agent = False
        self.mark = new_mark()  # in the environment of every process of this command (process_tree.py)
        self._pump: threading.Thread | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["/bin/bash", "-c", self.command], cwd=self.cwd, env={**self.env, MARK: self.mark}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **own_process_group(),
        )
        self._pump = threading.Thread(target=self._copy_output, name="output-pump", daemon=True)
        self._pump.start()
        log.info("process started", pid=self.process.pid, command=self.command)

    def _copy_output(self) -> None:
        fd = self.process.stdout.fileno()
        while True:
            data = os.read(fd, 65536)
            if not data:
                return
            self.sink.write(data)

    def wait(self) -> int:
        """The command's exit code, as a shell gives it: 128 + the signal's number for one a signal ended (143
        for SIGTERM), which Python's ``returncode`` gives as minus the number."""
        code = self.process.wait()
        if self.ends_leftovers or self.stopped_by_agent:
            self.end_leftovers()
        self._pump.join(10)  # every byte the group printed is in the sink before we report the exit
        return 128 - code if code < 0 else code

    def end_leftovers(self) -> None:
        """End whatever the exited command left running (workers in sessions of their own, daemons)."""
        left = end_tree(None, self.mark,  # its pid is reaped: only the mark is sure
                         grace=0.5 if self.stopped_by_agent else LEFTOVER_GRACE_SECONDS)
        if left:
            log.error("some processes of the job could not be ended", pids=[p.pid for p in left])

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def signal(self, signum: int) -> None:
        """Send a signal to the whole process group (the training process and its children) and to every other
        process the command started (torchrun's workers lead sessions of their own)."""
        if self.process and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:
                pass
            signal_all(members(self.process.pid, self.mark), signum)

    def wait_then_stop(self, own_exit: float, after_sigterm: float) -> None:
        """Give the process ``own_exit`` seconds to exit by itself, then stop it (SIGTERM, SIGKILL ``after_sigterm``
        seconds later)."""
        deadline = time.monotonic() + own_exit
        while time.monotonic() < deadline and self.process.poll() is None:
            time.sleep(0.02)
        if self.process.poll() is None:
            self.stop(after_sigterm)

    def stop(self, grace: float) -> None:
        """SIGTERM the group; SIGKILL whatever is left after ``grace`` seconds."""
        self.stopped_by_agent = True
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.process.poll() is None:
            time.sleep(0.05)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # also children that outlived the leader
        except (ProcessLookupError, PermissionError):
            pass
        signal_all(members(self.process.pid, self.mark), signal.SIGKILL)
