"""A training process whose agent is gone: the control channel closes under an open Checkpointer.

With RUNNER_AGENT_LOSS_GRACE_SECONDS (the agent sets it in supervise mode) the process stops at its next
step with a checkpoint, or, if it never gets there, is ended when the grace is up. Without it (a sidecar
whose agent may come back) the process trains on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from runner.checkpoint.local import LocalTier

REPO = Path(__file__).resolve().parents[2]
TRAIN = r'''
import sys, time
import torch
from runner.checkpoint import Checkpointer

hang = sys.argv[1] == "hang"
ckpt = Checkpointer(model=torch.nn.Linear(2, 2), interval="1h")
step = ckpt.restore()
while not ckpt.should_stop:
    step += 1
    time.sleep(0.02)
    ckpt.step(step)
    if step % 10 == 0:
        print("step", step, flush=True)
    if hang and step == 20:
        print("hanging", flush=True)
        time.sleep(600)
ckpt.close()
print("stopped at step", step, flush=True)
'''


def _start(tmp_path: Path, mode: str, grace: str | None):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = Path(tempfile.mkdtemp(prefix="ctl-")) / "control.sock"  # a Unix socket's path is short
    server.bind(str(path))
    server.listen(1)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RUNNER_CONTROL": str(path),
           "RUNNER_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    env.pop("RUNNER_AGENT_LOSS_GRACE_SECONDS", None)
    if grace is not None:
        env["RUNNER_AGENT_LOSS_GRACE_SECONDS"] = grace
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    process = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)
    server.settimeout(120)
    try:
        conn, _ = server.accept()
    except OSError:
        process.kill()
        raise AssertionError(f"the training process never connected: {process.communicate()[0][:3000]}")
    return process, server, conn


def _wait_for_line(process, text: str) -> list[str]:
    lines = []
    for line in process.stdout:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"never printed {text!r}: {''.join(lines)[-2000:]}")


def _agent_dies(server, conn) -> None:
    conn.close()
    server.close()


def test_the_process_stops_with_a_checkpoint_when_its_agent_is_gone(tmp_path):
    process, server, conn = _start(tmp_path, "train", grace="60")
    try:
        _wait_for_line(process, "step 10")
        _agent_dies(server, conn)
        out, _ = process.communicate(timeout=120)
        stopped = int(out.split("stopped at step")[1].split()[0])
        assert process.returncode == 0, out
        assert [step for step, _ in LocalTier(tmp_path / "ckpt").committed()] == [stopped]
    finally:
        process.kill()


def test_a_process_that_never_reaches_a_step_is_ended_when_the_grace_is_up(tmp_path):
    process, server, conn = _start(tmp_path, "hang", grace="1")
    try:
        _wait_for_line(process, "hanging")
        _agent_dies(server, conn)
        out, _ = process.communicate(timeout=120)
        assert process.returncode == 75, out
        assert "the node agent is gone" in out
    finally:
        process.kill()


def test_without_the_grace_variable_the_process_trains_on(tmp_path):
    process, server, conn = _start(tmp_path, "train", grace=None)
    try:
        seen = _wait_for_line(process, "step 10")
        _agent_dies(server, conn)
        _wait_for_line(process, "step 60")
        assert process.poll() is None
        assert not any("stopped" in line for line in seen)
    finally:
        process.kill()
        process.wait()
