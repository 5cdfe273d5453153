"""Telemetry under torchrun: every rank reports, the agent relays rank 0's steps with the largest peak."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agents.control import ControlServer
from agents.telemetry import TelemetryRelay

TRAINEE = Path(__file__).with_name("telemetry_trainee.py")
TIMEOUT = 240  # generous: a busy 2-core machine starts ranks slowly; nothing here waits on a clock


def test_two_ranks_report_through_a_real_agent_socket(tmp_path):
    """Rank 0 alone sends the manifest; the relayed report has rank 0's steps and NaN steps, rank 1's peak."""
    messages: list[dict] = []
    server = ControlServer(tmp_path / "control.sock", messages.append).start()
    try:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                   str(TRAINEE), "--steps", "12", "--local-dir", str(tmp_path / "ckpt"),
                   "--nan", "0:3", "--nan", "0:7", "--nan", "1:5"]
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
               "RUNNER_CONTROL": str(tmp_path / "control.sock"), "RUNNER_ATTEMPT": "1", "RUNNER_JOB_ID": "job-1"}
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        server.drain()
    finally:
        server.close()

    manifests = [m for m in messages if m["op"] == "manifest"]
    assert len(manifests) == 1 and manifests[0]["rank"] == 0
    finals = {m["rank"]: m for m in messages if m["op"] == "telemetry" and m["final"]}
    assert {rank: (m["steps"], m["nan_steps"]) for rank, m in finals.items()} == {0: (12, 2), 1: (12, 1)}
    assert finals[1]["peak_memory_bytes"] > finals[0]["peak_memory_bytes"] + (128 << 20)

    relay, forwarded = TelemetryRelay(), []
    for message in messages:
        if message["op"] == "telemetry" and (report := relay.update(message)) is not None:
            forwarded.append(report)
    assert forwarded[-1]["steps"] == 12 and forwarded[-1]["nan_steps"] == 2
    assert forwarded[-1]["peak_memory_bytes"] == finals[1]["peak_memory_bytes"]
