"""A process started ahead on a GPU node holds before its first CUDA use until the agent's word
(runner/checkpoint/cuda_gate.py): real processes, the agent's real end of the control channel.

On a CPU-only torch the first CUDA use, once let through, fails as it always would ("not compiled with CUDA"):
what matters here is that it is held until the word, and reported. test_cuda_gate_gpu.py shows the same on a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from agents.control import ControlServer

TRAINEE = Path(__file__).with_name("cuda_gate_trainee.py")
TIMEOUT = 240.0  # a busy machine's torch import can take a minute


class Job:
    """The trainee started ahead (``RUNNER_RESUME_WAIT=1``, ``RUNNER_CUDA_GATE=1``) beside an agent's channel."""

    def __init__(self, first_use: str, megabytes: int = 0):
        self.folder = tempfile.TemporaryDirectory(prefix="gate")  # short: an AF_UNIX path has 107 bytes
        self.messages: list[dict] = []
        self.control = ControlServer(Path(self.folder.name) / "c.sock", self.messages.append).start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update({"RUNNER_CONTROL": str(self.control.path), "RUNNER_RESUME_WAIT": "1", "RUNNER_CUDA_GATE": "1",
                    "PYTHONUNBUFFERED": "1"})
        self.process = subprocess.Popen([sys.executable, str(TRAINEE), first_use, str(megabytes)], env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True).start()

    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, condition, what: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}; output:\n{self.output()}"
            assert self.process.poll() is None or condition(), f"exited before {what}; output:\n{self.output()}"
            time.sleep(0.05)

    def waiting(self) -> dict:
        self.wait_for(lambda: any(m["op"] == "waiting" for m in self.messages), "the process to say waiting")
        return next(m for m in self.messages if m["op"] == "waiting")

    def ask_cuda_initialized(self) -> str:
        before = self.output().count("cuda initialized:")
        self.process.stdin.write("?\n")
        self.process.stdin.flush()
        self.wait_for(lambda: self.output().count("cuda initialized:") > before, "its answer")
        return [line for line in self.lines if line.startswith("cuda initialized:")][-1].strip()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        self.control.close()
        self.folder.cleanup()


@pytest.mark.parametrize("first_use", ["python", "tensor"])
def test_a_process_started_ahead_holds_at_its_first_cuda_use_until_the_word(first_use):
    """Imports done, it says ``waiting`` at ``before_cuda`` and holds with CUDA untouched; the agent's ``resume``
    lets the first CUDA use go on (torch's Python path and its C++ one alike), with the step handed over set as
    any attempt's."""
    job = Job(first_use)
    try:
        waiting = job.waiting()
        assert (waiting["at"], waiting["pid"]) == ("before_cuda", job.process.pid)
        assert "runner.checkpoint imported" in job.output()
        assert job.ask_cuda_initialized() == "cuda initialized: False"
        assert "past the first CUDA use" not in job.output()  # held: only the word lets it on

        job.control.send({"op": "resume", "step": 7, "attempt": 3})
        job.wait_for(lambda: "past the first CUDA use" in job.output(), "the first CUDA use to go on")
        assert job.process.wait(60) == 0
        assert "resume step 7, waits None" in job.output()  # a Checkpointer built now is the attempt's
        if not __import__("torch").cuda.is_available():
            assert "not compiled with CUDA" in job.output()  # then it behaved as it would have
    finally:
        job.close()


def test_a_word_received_in_restore_lets_the_later_cuda_use_through():
    """A script that restores on the CPU before its first CUDA use waits in ``restore()``; the ``resume`` there
    opens the hold too: the CUDA use after it goes on without a second ``waiting``."""
    job = Job("restore_first")
    try:
        assert "at" not in job.waiting()  # in restore()
        job.control.send({"op": "resume", "step": None, "attempt": 3})
        job.wait_for(lambda: "past the first CUDA use" in job.output(), "the CUDA use after the restore")
        assert job.process.wait(60) == 0
        assert "restored step 0" in job.output()
        assert [m.get("at") for m in job.messages if m["op"] == "waiting"] == [None]
    finally:
        job.close()


def test_cuda_used_before_the_library_is_imported_is_said_and_held_at_the_import():
    """The hold cannot apply: one log line says why, ``waiting`` says ``after_cuda`` (a kept GPU node's agent
    stops such a process: tests/agents/test_gpu_start_ahead.py), and the process holds at the import."""
    job = Job("before_import")
    try:
        waiting = job.waiting()
        assert (waiting["at"], waiting["pid"]) == ("after_cuda", job.process.pid)
        job.wait_for(lambda: "CUDA was initialised before runner.checkpoint was imported" in job.output(),
                     "the log line")
        assert "runner.checkpoint imported" not in job.output()
    finally:
        job.close()


def test_the_agent_gone_before_the_word_fails_the_first_cuda_use():
    """No ``resume`` will come (the job runs elsewhere): the held CUDA call raises, saying so."""
    job = Job("python")
    try:
        job.waiting()
        job.control.close()
        job.wait_for(lambda: "past the first CUDA use" in job.output(), "the held call to end")
        assert "CheckpointError: the node agent went away before this process's attempt started" in job.output()
    finally:
        job.close()
