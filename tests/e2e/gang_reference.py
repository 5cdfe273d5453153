"""The reference of the 2-node x 2-rank gang tests: examples/multinode/train.py trained from start to end on two
torchrun "nodes" of two ranks each (gloo, CPU), outside the runner; its final weights' sha256.

tests/e2e/test_multinode.py and test_gang_train_through.py preempt gangs of this training, with the same steps and
`--bit-exact`, and compare their final weights with it. Pauses between steps and progress lines do not change the
weights, so one uninterrupted run serves them all: it is computed once per test session, by the first test that
asks for it, and under `pytest -n N` the workers share it through a file in the session's temporary folder (a 2 x 2
run costs a minute of CPU on a 2-core machine, most of it starting six processes).
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import subprocess
import sys
import tempfile
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


def _train_uninterrupted(folder: Path) -> str:
    port = _free_port()
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    nodes = []
    for rank in (0, 1):
        cwd = folder / f"node{rank}"
        cwd.mkdir()
        command = TORCHRUN.format(nodes=2, rank=rank, addr="127.0.0.1", port=port).split()
        nodes.append(subprocess.Popen([*command, str(TRAIN), *TRAINING.split(), "--step-time", "0"], cwd=cwd,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [node.communicate(timeout=600)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert all(node.returncode == 0 for node in nodes), outputs
    return FINAL.search(outputs[0]).group(1)


class UninterruptedGang:
    """``sha256()``: the reference's final weights, trained at the first call of the session (by any worker)."""

    def __init__(self, shared: Path):
        self.shared = shared

    def sha256(self) -> str:
        result = self.shared / "uninterrupted-gang.sha256"
        with open(self.shared / "uninterrupted-gang.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker training it: wait for its result (released if it dies)
            if not result.is_file():
                sha = _train_uninterrupted(Path(tempfile.mkdtemp(prefix="uninterrupted-gang-", dir=self.shared)))
                result.write_text(sha)
            return result.read_text()


@pytest.fixture(scope="session")
def uninterrupted_gang(tmp_path_factory) -> UninterruptedGang:
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's folder is in the session's own folder, which the workers share (and no other run).
    return UninterruptedGang(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
