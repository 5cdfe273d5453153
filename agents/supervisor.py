"""Running one shell command of the job as its own process group, with its output streamed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import structlog

log = structlog.get_logger(__name__)


def own_process_group() -> dict:
    """Popen arguments that start the child as the leader of a new process group, in the agent's session.

    Not a new session (``start_new_session``): the local provider powers a node off by killing every process
    of the node's session, the job's included. Python 3.11's ``process_group=0`` calls setpgid in the child
    without running Python there; 3.10 has only ``preexec_fn``, here os.setpgrp between fork and exec: one
    system call, which takes no lock that another thread of the agent could be holding.
    """
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}


class Supervisor:
    """One child process group; ``stop()`` sends SIGTERM to the group, then SIGKILL after a grace."""

    def __init__(self, command: str, cwd: str, env: dict[str, str], sink):
        self.command = command
        self.cwd = cwd
        self.env = env
        self.sink = sink  # .write(bytes)
        self.process: subprocess.Popen | None = None
        self.stopped_by_agent = False
        self._pump: threading.Thread | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["/bin/bash", "-c", self.command], cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
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
        code = self.process.wait()
        self._pump.join(10)  # every byte the group printed is in the sink before we report the exit
        return code

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def signal(self, signum: int) -> None:
        """Send a signal to the whole process group (the training process and its children)."""
        if self.process and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:
                pass

    def wait_or_stop(self, grace: float) -> None:
        """Give the process ``grace`` seconds to exit by itself, then stop it."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.process.poll() is None:
            time.sleep(0.02)
        if self.process.poll() is None:
            self.stop(min(2.0, grace))

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
