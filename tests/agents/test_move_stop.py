"""The agent's side of a move to spot: the heartbeat's ``move`` stops a real training process with a checkpoint
over the real control channel, exactly as a cancel does, and the attempt's end is reported as ``moved``."""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

from agents.config import AgentConfig
from agents.emergency import ChildProcess, EmergencyStop
from agents.main import Agent
from runner.protocol.actions import Action
from runner.protocol.events import EndReason

TRAINEE = r'''
import time
import torch
from runner.checkpoint import Checkpointer

model = torch.nn.Linear(4, 4)
ckpt = Checkpointer(model=model, interval="1h")
step = ckpt.restore()
while not ckpt.should_stop:
    step += 1
    time.sleep(0.02)
    ckpt.step(step)
    if step == 5:
        print("training", flush=True)
ckpt.close()
print("stopped at step", step, "for", ckpt.stop_reason, flush=True)
'''


class Output:
    """The log shipper's place: what the job printed."""

    def __init__(self):
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def text(self) -> str:
        return self.data.decode(errors="replace")


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_move_stops_the_job_with_a_checkpoint_and_reports_moved(tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "train.py").write_text(TRAINEE)
    durable = tmp_path / "durable"
    agent = Agent(AgentConfig(scratch_dir=tmp_path / "scratch", node_id="n-move", stop_grace_seconds=30.0))
    agent.assignment = {"job_id": "j", "attempt": 2, "run": f"{sys.executable} train.py", "env": {},
                        "checkpoint": {"local_dir": str(tmp_path / "local"), "durable_url": durable.as_uri(),
                                       "interval": None, "keep": 3, "resume": None}}
    agent.control = agent.open_control_channel()
    agent.emergency = EmergencyStop(send=agent.send_control,
                                    trainee=ChildProcess(lambda: agent.current, lambda: agent.training_pid))
    agent.shipper = Output()
    ended: list[tuple] = []
    runner = threading.Thread(target=lambda: ended.append(agent._run_job(workdir, with_setup=False)))
    try:
        runner.start()
        wait_for(lambda: "training" in agent.shipper.text() and agent.training_pid, "the job to train")
        agent._on_action(Action.MOVE_TO_SPOT)
        runner.join(60)
        assert not runner.is_alive(), "the job did not stop"
    finally:
        agent.control.close()

    reason, code, message, drill = ended[0]
    assert (reason, code) == (EndReason.MOVED, 0), agent.shipper.text()  # it stopped by itself, after its checkpoint
    stopped = int(re.search(r"stopped at step (\d+) for move\n", agent.shipper.text()).group(1))  # it knows why
    assert agent.cancel_stop.ack["step"] == stopped and agent.cancel_stop.ack["durable"]
    committed = [p.name for p in Path(durable).rglob("step-*")]
    assert f"step-{stopped:08d}" in committed, f"the stop's checkpoint is not durable: {committed}"
