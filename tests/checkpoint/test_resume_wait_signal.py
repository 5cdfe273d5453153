"""A process started ahead of its attempt, waiting in ``restore()`` for the handover, ends at SIGTERM or SIGUSR1
(runner/checkpoint/resume_wait.py): it has no attempt yet and nothing to save. Its library's signal handler only
records a stop, so before this the wait went on and only SIGKILL ended it."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.checkpoint.test_cuda_gate import TIMEOUT, Job


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_process_waiting_in_restore_for_its_attempt_ends_at_a_stop_signal(signum):
    job = Job("restore_first")
    try:
        waiting = job.waiting()
        assert (waiting["pid"], waiting.get("at", "restore")) == (job.process.pid, "restore")
        job.process.send_signal(signum)
        try:
            code = job.process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still waiting {TIMEOUT:.0f} s after {signum.name}; output:\n{job.output()}")
        assert code == 128 + signum, job.output()
        assert "nothing to save" in job.output() and "restored step" not in job.output()
    finally:
        job.close()
