"""The Hugging Face callback under torchrun (2 ranks, gloo on CPU): one stop step for every rank.

SIGTERM reaches rank 1 only, at step 5; the ranks agree through the checkpoint library's step agreement and
both stop at step 6 with one checkpoint holding both ranks' RNG states, from which both ranks resume.
(Resumed this way the run also ends with an uninterrupted 2-rank run's weights: the Trainer restores each
rank's RNG file itself; that comparison is left to the Lightning test, where the callback does it.)
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from .conftest import HERE, clean_env

# Skipped without transformers (not imported here: the trainees import it; collection stays light).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers is not installed")
FINAL = re.compile(r"final weights sha256 ([0-9a-f]{64})")


def torchrun_script(script: str, *args: str, cwd, env) -> subprocess.CompletedProcess:
    """Run a trainee of this folder under torchrun with 2 local ranks."""
    # --standalone: the launcher binds a free port itself (a port picked here could be taken before it binds)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(HERE / script), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def torchrun(*args: str, cwd, env) -> subprocess.CompletedProcess:
    return torchrun_script("hf_trainee.py", "--steps", "12", *args, cwd=cwd, env=env)


def test_sigterm_to_one_rank_stops_both_at_one_step_and_both_resume_from_it(tmp_path):
    runner_env = clean_env(RUNNER_CHECKPOINT_DIR=str(tmp_path / "node"),
                           RUNNER_CHECKPOINT_URL=f"file://{tmp_path / 'durable'}")
    stopped = torchrun("--output-dir", "out", "--sigterm-at", "5", "--sigterm-rank", "1", cwd=tmp_path,
                       env=runner_env)
    assert stopped.returncode == 0, stopped.stdout[-2000:] + stopped.stderr[-3000:]
    said = re.findall(r"stopping at step (\d+) for a preemption", stopped.stdout + stopped.stderr)
    assert said == ["6", "6"]  # every rank, the same step: the one after the step rank 1 was signalled in
    assert sorted(p.name for p in (tmp_path / "node").glob("step-*")) == ["step-00000006"]
    files = {p.name for p in (tmp_path / "node" / "step-00000006").iterdir()}
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "manifest.json"} <= files
    assert (tmp_path / "durable" / "step-00000006" / "manifest.json").is_file()

    resumed = torchrun("--output-dir", "out", cwd=tmp_path, env=runner_env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count(f"resuming from {tmp_path / 'node' / 'step-00000006'}") == 2
    assert len(set(FINAL.findall(resumed.stdout))) == 1 and len(FINAL.findall(resumed.stdout)) == 2
