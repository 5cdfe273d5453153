"""A reference run (training outside the runner, from start to end) shared by every test of a session that compares
final weights with it: its processes' output ends with the final weights' sha256, and they are started once per test
session, not once per test (each costs seconds of CPU, most of it torch starting).

The first test to set it up starts it in the background, where it trains while that test's job runs; under
`pytest -n N` the workers share its result through a file in the session's temporary folder, and a worker that
needs it while another trains it waits for that run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable

FINAL = re.compile(r"final weights sha256 ([0-9a-f]{64})")


def shared_folder(tmp_path_factory) -> Path:
    """The session's temporary folder: under xdist each worker's folder is in the session's own folder, which the
    workers share (and no other run)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _kill(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def _finish(processes: list[subprocess.Popen]) -> str:
    """Wait for the run's end; its final weights' sha256 (what the first process printed)."""
    try:
        outputs = [process.communicate(timeout=600)[0] for process in processes]
    finally:
        _kill(processes)
    assert all(process.returncode == 0 for process in processes), outputs
    return FINAL.search(outputs[0]).group(1)


class SessionReference:
    """The reference run ``name``: ``start(folder)`` starts its processes in ``folder`` (each in a session of its own,
    its stdout and stderr one text pipe). The first worker of the session to set this up trains it in the background
    and writes its result, holding a lock meanwhile; ``sha256()`` waits for that result, or trains it itself where
    that run failed."""

    def __init__(self, shared: Path, name: str, start: Callable[[Path], list[subprocess.Popen]]):
        self.shared, self.name, self.start_processes = shared, name, start
        self.result = shared / f"{name}.sha256"
        self.lock_path = shared / f"{name}.lock"
        self.processes: list[subprocess.Popen] = []

    def start(self) -> None:
        lock = open(self.lock_path, "a")  # noqa: SIM115 - held until the result is written, by the thread below
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another worker is training it
            lock.close()
            return
        if self.result.is_file():
            lock.close()
            return
        self.processes = self.start_processes(self._folder())
        threading.Thread(target=self._write_result, args=(lock,), daemon=True).start()

    def _write_result(self, lock) -> None:
        with lock, contextlib.suppress(Exception):  # a run that failed: sha256() trains it again, showing why
            self.result.write_text(_finish(self.processes))

    def sha256(self) -> str:
        with open(self.lock_path, "a") as lock:  # a lock of its own: waits for the run in the background too
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.result.is_file():
                self.result.write_text(_finish(self.start_processes(self._folder())))
            return self.result.read_text()

    def _folder(self) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=self.shared))

    def stop(self) -> None:
        _kill(self.processes)
