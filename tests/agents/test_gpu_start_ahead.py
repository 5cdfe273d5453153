"""A kept gang node with a GPU starts the gang's next attempt ahead, its ranks held before their first CUDA use
(agents/gang_prestart.py, runner/checkpoint/cuda_gate.py); it used to decline. Real agent, real job process and
control channel; the GPU is a device file the agent finds (``ACCELERATOR_DEVICES``), the controller a recorder."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from agents import gang_prestart
from agents.config import AgentConfig
from agents.main import Agent

TRAINEE = Path(__file__).parents[1] / "checkpoint" / "cuda_gate_trainee.py"
TIMEOUT = 240.0  # a busy machine's torch import can take a minute


class Controller:
    """The agent's reporter, as far as the start ahead uses it: every event posted, each accepted."""

    def __init__(self):
        self.client = self
        self.events: list[dict] = []

    def patiently(self, call, what: str):
        return call()

    def post(self, path: str, body: dict) -> dict:
        self.events.append(body)
        return {"accepted": True}

    def prestart_states(self) -> list[tuple[str, str | None]]:
        return [(e["data"]["state"], e["data"].get("message")) for e in self.events if e["kind"] == "prestart"]


class Output:
    def __init__(self):
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def text(self) -> str:
        return self.data.decode(errors="replace")


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def assignment(attempt: int, run: str, tmp_path: Path, port: int, step: int | None = None) -> dict:
    return {"job_id": "j", "attempt": attempt, "run": run, "env": {},
            "checkpoint": {"local_dir": str(tmp_path / "local"), "durable_url": (tmp_path / "durable").as_uri(),
                           "interval": None, "keep": 3, "resume": {"step": step} if step else None},
            "gang": {"num_nodes": 2, "node_rank": 1, "node_ips": ["10.0.0.1", "10.0.0.2"],
                     "master_addr": "10.0.0.1", "master_port": port, "gpus_per_node": 1}}


@pytest.fixture
def kept_gpu_node(tmp_path, monkeypatch):
    gpu = tmp_path / "nvidia0"
    gpu.touch()
    monkeypatch.setattr(gang_prestart, "ACCELERATOR_DEVICES", (str(gpu),))
    agent = Agent(AgentConfig(scratch_dir=tmp_path / "scratch", node_id="n-gpu", stop_grace_seconds=5.0))
    (agent.config.scratch_dir / "work").mkdir(parents=True)
    agent.local_log = open(agent.config.scratch_dir / "job.log", "ab")  # noqa: SIM115 - closed at the end
    agent.reporter = Controller()
    agent.assignment = assignment(2, "sleep 600", tmp_path, 29500)  # the running attempt's
    agent.control = agent.open_control_channel()
    yield agent
    agent.shutdown.set()
    agent._discard_ahead()
    if agent.adopted is not None:
        agent.adopted.discard(5.0)
    agent.control.close()
    agent.local_log.close()


def test_a_kept_gpu_node_starts_ahead_holding_before_cuda_and_lets_go_at_the_adoption(kept_gpu_node, tmp_path):
    agent = kept_gpu_node
    run = f"{sys.executable} {TRAINEE} tensor"
    agent._on_prestart(assignment(3, run, tmp_path, 29600))
    assert agent.prestarted is not None, f"declined: {agent.reporter.prestart_states()}"
    assert agent.prestarted.supervisor.env["RUNNER_CUDA_GATE"] == "1"
    wait_for(lambda: ("waiting", gang_prestart.HOLDS_BEFORE_CUDA) in agent.reporter.prestart_states(),
             "the node to report its ranks held before CUDA")
    assert agent.reporter.prestart_states()[0] == ("started", None)
    assert "past the first CUDA use" not in agent.prestarted.output._buffer.decode()

    # The old attempt's processes on this node are gone: the next attempt adopts the process, whose first CUDA
    # use then goes on, resuming from the step handed over
    agent.assignment = assignment(3, run, tmp_path, 29600, step=7)
    agent.shipper = Output()
    assert agent._adopt_prestarted()
    wait_for(lambda: "past the first CUDA use" in agent.shipper.text(), "the held CUDA use to go on")
    assert "resume step 7" in agent.shipper.text()
    assert agent.current.wait() == 0


def test_a_rank_that_used_cuda_before_the_library_is_stopped_and_reported_failed(kept_gpu_node, tmp_path):
    """It cannot hold before CUDA beside the running attempt: stopped at once, the node says why (the gang's next
    attempt then starts anew at the handover)."""
    agent = kept_gpu_node
    agent._on_prestart(assignment(3, f"{sys.executable} {TRAINEE} before_import", tmp_path, 29600))
    started = agent.prestarted
    assert started is not None
    wait_for(lambda: any(state == "failed" for state, _ in agent.reporter.prestart_states()), "the failed report")
    assert agent.reporter.prestart_states()[-1] == ("failed", gang_prestart.CUDA_TOO_EARLY)
    assert agent.prestarted is None and not started.running()
