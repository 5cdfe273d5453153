"""Bit-exact resume of a real training process after SIGTERM and after SIGKILL at random moments."""

from __future__ import annotations

import random
import signal
import time

from .conftest import kill, read_ready, run_trainee, start_trainee


def test_sigterm_checkpoints_stops_and_resumes_bit_exact(reference_hashes, tmp_path):
    """SIGTERM mid-run: the trainee saves, exits 0 at step N; the next run resumes at N and ends identical."""
    ckpt = str(tmp_path / "ckpt")
    proc = start_trainee("--steps", "60", "--local-dir", ckpt, "--step-time", "0.03", cwd=tmp_path)
    assert read_ready(proc)[0] == 0
    time.sleep(0.6)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    stopped = [line for line in out.splitlines() if line.startswith("stopped")]
    assert stopped, out[-2000:]
    step = int(stopped[0].split()[1])
    assert 0 < step < 60
    ready, final = run_trainee("--steps", "60", "--local-dir", ckpt, cwd=tmp_path)
    assert ready == f"ready {step} {reference_hashes[step]}"
    assert final == reference_hashes["final"]


def test_sigkill_at_random_moments_never_restores_a_wrong_state(reference_hashes, tmp_path):
    """Killed with SIGKILL mid-save twice, each restart restores a state of the uninterrupted run,
    and the run that finishes ends bit-exact."""
    ckpt = str(tmp_path / "ckpt")
    args = ("--steps", "60", "--local-dir", ckpt, "--pad-mb", "3", "--step-time", "0.01")
    rng = random.Random(1234)
    restored = []
    for _ in range(2):
        proc = start_trainee(*args, "--every-steps", "1", cwd=tmp_path)
        step, sha = read_ready(proc)
        restored.append(step)
        assert sha == reference_hashes[step], f"restored a wrong state at step {step}"
        time.sleep(rng.uniform(0.1, 0.6))
        kill(proc)
        proc.communicate(timeout=30)
    ready, final = run_trainee(*args, "--every-steps", "25", cwd=tmp_path)
    step, sha = ready.split()[1:]
    assert sha == reference_hashes[int(step)]
    restored.append(int(step))
    assert final == reference_hashes["final"]
    assert restored[-1] > 0, f"the kills should have left committed checkpoints: {restored}"
