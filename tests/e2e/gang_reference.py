"""The reference of the 2-node x 2-rank gang tests: examples/multinode/train.py trained from start to end on two
torchrun "nodes" of two ranks each (gloo, CPU), outside the runner; its final weights' sha256.

tests/e2e/test_multinode.py and test_gang_train_through.py preempt gangs of this training, with the same steps and
`--bit-exact`, and compare their final weights with it. Pauses between steps and progress lines do not change the
weights, so one uninterrupted run serves them all: once per test session (a 2 x 2 run costs a minute of CPU on a
2-core machine, most of it starting six processes). The first test to set it up starts it in the background, where
it trains while that test's job runs; under `pytest -n N` the workers share its result through a file in the
session's temporary folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from conftest import REPO

TRAIN = REPO / "examples" / "multinode" / "train.py"
STEPS = 600
# The weights depend on these; a test adds its own --step-time and --log-every (they do not change the weights).
TRAINING = f"--steps {STEPS} --interval 1h --bit-exact"
TORCHRUN = ("torchrun --nnodes={nodes} --node-rank={rank} --nproc-per-node=2 "
            "--master-addr={addr} --master-port={port}")
FINAL = re.compile(r"final weights sha256 ([0-9a-f]{64})")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start(folder: Path) -> list[subprocess.Popen]:
    """The two torchrun "nodes" of the uninterrupted run, started in ``folder``."""
    port = _free_port()
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    nodes = []
    for rank in (0, 1):
        cwd = folder / f"node{rank}"
        cwd.mkdir()
        command = TORCHRUN.format(nodes=2, rank=rank, addr="127.0.0.1", port=port).split()
        # A session of its own: a kill ends the launcher's workers with it (they outlive a launcher killed alone).
        nodes.append(subprocess.Popen([*command, str(TRAIN), *TRAINING.split(), "--step-time", "0"], cwd=cwd,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return nodes


def _kill(nodes: list[subprocess.Popen]) -> None:
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)


def _finish(nodes: list[subprocess.Popen]) -> str:
    """Wait for the run's end; its final weights' sha256."""
    try:
        outputs = [node.communicate(timeout=600)[0] for node in nodes]
    finally:
        _kill(nodes)
    assert all(node.returncode == 0 for node in nodes), outputs
    return FINAL.search(outputs[0]).group(1)


class UninterruptedGang:
    """The first worker of the session to set this up trains the reference in the background (while its test's job
    runs) and writes its result, holding a lock meanwhile; ``sha256()`` waits for that result, or trains it
    itself where that run failed."""

    def __init__(self, shared: Path):
        self.shared = shared
        self.result = shared / "uninterrupted-gang.sha256"
        self.lock_path = shared / "uninterrupted-gang.lock"
        self.nodes: list[subprocess.Popen] = []

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
        self.nodes = _start(self._folder())
        threading.Thread(target=self._write_result, args=(lock,), daemon=True).start()

    def _write_result(self, lock) -> None:
        with lock, contextlib.suppress(Exception):  # a run that failed: sha256() trains it again, showing why
            self.result.write_text(_finish(self.nodes))

    def sha256(self) -> str:
        with open(self.lock_path, "a") as lock:  # a lock of its own: waits for the run in the background too
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.result.is_file():
                self.result.write_text(_finish(_start(self._folder())))
            return self.result.read_text()

    def _folder(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="uninterrupted-gang-", dir=self.shared))

    def stop(self) -> None:
        _kill(self.nodes)


@pytest.fixture(scope="session")
def uninterrupted_gang(tmp_path_factory) -> UninterruptedGang:
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's folder is in the session's own folder, which the workers share (and no other run).
    reference = UninterruptedGang(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
    reference.start()
    yield reference
    reference.stop()
