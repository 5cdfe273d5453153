"""The Lightning callback under torchrun (DDP, 2 ranks, gloo on CPU): one stop step, every rank's RNG back.

SIGTERM reaches rank 1 only, at step 7; both ranks stop at step 8 with one checkpoint, resumed on a new node
(both ranks fetch it from the durable tier into one local folder, one at a time). Each rank draws its
own dropout masks, so the resumed run ends with the uninterrupted run's weights only because the callback
keeps every rank's RNG states and sampler position (Lightning keeps rank 0's checkpoint alone).
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from .conftest import clean_env
from .test_transformers_torchrun import FINAL, torchrun_script

# Skipped without lightning (not imported here: the trainees import it; collection stays light).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed")


def test_sigterm_to_one_rank_stops_both_at_one_step_and_each_rank_resumes_bit_exact(tmp_path):
    durable = f"file://{tmp_path / 'durable'}"
    env = clean_env(RUNNER_CHECKPOINT_DIR=str(tmp_path / "node"), RUNNER_CHECKPOINT_URL=durable)
    stopped = torchrun_script("pl_ddp_trainee.py", "--sigterm-at", "7", cwd=tmp_path, env=env)
    assert stopped.returncode == 0, stopped.stdout[-2000:] + stopped.stderr[-3000:]
    assert re.findall(r"stopping at step (\d+) for a preemption", stopped.stdout + stopped.stderr) == ["8", "8"]
    assert sorted(p.name for p in (tmp_path / "node").glob("step-*")) == ["step-00000008"]

    # On a new node: both ranks look for it at once; one fetches it from the durable tier, the other verifies.
    new_node = clean_env(RUNNER_CHECKPOINT_DIR=str(tmp_path / "new-node"), RUNNER_CHECKPOINT_URL=durable)
    resumed = torchrun_script("pl_ddp_trainee.py", cwd=tmp_path, env=new_node)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count(f"resuming from {tmp_path / 'new-node' / 'step-00000008' / 'model.ckpt'}") == 2
    uninterrupted = torchrun_script("pl_ddp_trainee.py", cwd=tmp_path, env=clean_env())
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    assert len(FINAL.findall(resumed.stdout)) == 2
    assert set(FINAL.findall(resumed.stdout)) == set(FINAL.findall(uninterrupted.stdout))
