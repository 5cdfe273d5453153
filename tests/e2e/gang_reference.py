"""The reference of the 2-node x 2-rank gang tests: examples/multinode/train.py trained from start to end by the same
four ranks (gloo, CPU), outside the runner; its final weights' sha256.

tests/e2e/test_gang_train_through.py preempts a gang of this training, with the same steps and `--bit-exact`, and
compares its final weights with it. Pauses between steps and progress lines do not change the weights, so one
uninterrupted run serves them all: once per test session (200 steps cost about 20 s of CPU, most of it starting the
processes), shared as tests/e2e/session_reference.py says. Each step of the gang costs CPU (about 30 ms for the four
ranks together), in the reference and in every attempt that trains without pauses, so the training is kept short:
the tests that must still be training at an event pause longer between steps rather than train more of them.

The weights depend on the four ranks, not on how many launchers start them: the reference runs them under one
torchrun (``--standalone``), which binds its own rendezvous port. Two launchers of two "nodes" each would need a port
picked before either started; on a busy machine another process can take it meanwhile, and the second launcher then
waits for a rendezvous that never comes (minutes, until its timeout).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from session_reference import FINAL, SessionReference, shared_folder  # noqa: F401 - FINAL: the gang tests' too

TRAIN = REPO / "examples" / "multinode" / "train.py"
STEPS = 200
# The weights depend on these; a test adds its own --step-time and --log-every (they do not change the weights).
TRAINING = f"--steps {STEPS} --interval 1h --bit-exact"
TORCHRUN = ("torchrun --nnodes={nodes} --node-rank={rank} --nproc-per-node=2 "
            "--master-addr={addr} --master-port={port}")


def _start(folder: Path) -> list[subprocess.Popen]:
    """The uninterrupted run's launcher, started in ``folder``: four ranks on this machine."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    # A session of its own: a kill ends the launcher's workers with it (they outlive a launcher killed alone).
    return [subprocess.Popen(["torchrun", "--standalone", "--nproc-per-node=4", str(TRAIN), *TRAINING.split(),
                              "--step-time", "0"], cwd=folder, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)]


@pytest.fixture(scope="session")
def uninterrupted_gang(tmp_path_factory) -> SessionReference:
    reference = SessionReference(shared_folder(tmp_path_factory), "uninterrupted-gang", _start)
    reference.start()
    yield reference
    reference.stop()
