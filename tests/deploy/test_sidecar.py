"""The agent as a container sidecar (`mode: sidecar`): a real `runner agent` beside a training process it did
not start, reached through the control socket, with the clouds' fake metadata servers on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from notify_fixtures import FakeAgentAPI, assignment

from runner.providers.local.metadata import inject_notice, serve_all

TRAINEE = '''
import sys, time
from runner.checkpoint import Checkpointer

ckpt = Checkpointer(extra={"loss": 0.0})
step = ckpt.restore()
print(f"trainee restored={step}", flush=True)
give_up = time.monotonic() + float(sys.argv[1])
while time.monotonic() < give_up:
    step += 1
    ckpt.extra["loss"] = 1.0 / step
    ckpt.step(step)
    if ckpt.should_stop:
        break
    time.sleep(0.02)
ckpt.close()
print(f"trainee stopped={ckpt.should_stop} step={step}", flush=True)
'''


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNNER_", "NOTIFY_", "WATCHDOG_"))}
    for variable in ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "GCE_METADATA_HOST", "GCE_METADATA_IP"):
        env.pop(variable, None)
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _end(process: subprocess.Popen, signum: int = signal.SIGTERM, timeout: float = 20) -> int:
    if process.poll() is None:
        process.send_signal(signum)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    return process.returncode


class SidecarAgent:
    """`runner agent` in sidecar mode, with its scratch folder (the shared volume) under ``root``."""

    def __init__(self, root: Path, env: dict[str, str], **config):
        self.root = root
        self.scratch = root / "shared"
        self.scratch.mkdir(parents=True)
        self.socket = self.scratch / "control.sock"
        self.log_file = root / "agent.jsonl"
        path = root / "agent.yaml"
        path.write_text(yaml.safe_dump({"mode": "sidecar", "scratch_dir": str(self.scratch), **config}))
        self.process = subprocess.Popen([sys.executable, "-m", "runner.cli.main", "agent", "--config", str(path)],
                                        env=_clean_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.wait_for("sidecar serving the control channel")

    def lines(self) -> list[dict]:
        if not self.log_file.exists():
            return []
        return [json.loads(line) for line in self.log_file.read_text().splitlines() if line.strip()]

    def wait_for(self, event: str, timeout: float = 30.0) -> dict:
        """The first log line whose event starts with ``event``, waiting for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.lines() if line["event"].startswith(event)]
            if found:
                return found[0]
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"the agent never logged {event!r}; rc={self.process.poll()}; log: "
                             f"{[line['event'] for line in self.lines()]}")

    def stop(self) -> int:
        return _end(self.process)


def start_trainee(root: Path, agent: SidecarAgent, seconds: float = 60, control: bool = True) -> subprocess.Popen:
    """The training process, started by the test (as by a training container), not by the agent."""
    script = root / "train.py"
    script.write_text(TRAINEE)
    env = {"RUNNER_CHECKPOINT_DIR": str(root / "local" / secrets.token_hex(4)),
           "RUNNER_CHECKPOINT_URL": (root / "durable").as_uri()}
    if control:
        env["RUNNER_CONTROL"] = str(agent.socket)
    return subprocess.Popen([sys.executable, str(script), str(seconds)], env=_clean_env(**env), cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stopped_step(out: str) -> int:
    """The step a training process stopped at on should_stop, from its own output."""
    return int(re.search(r"^trainee stopped=True step=(\d+)$", out, re.M).group(1))


def restorable_step(root: Path, agent: SidecarAgent) -> int:
    """The step a fresh training process, with an empty local tier, restores from the durable tier."""
    process = start_trainee(root, agent, seconds=0, control=False)
    out, _ = process.communicate(timeout=60)
    return int(re.search(r"^trainee restored=(\d+)$", out, re.M).group(1))


@pytest.fixture(scope="module", params=["aws", "gcp"])
def preempted(request, tmp_path_factory):
    """A spot notice through ``cloud``'s metadata protocol while a training process is connected."""
    cloud = request.param
    root = tmp_path_factory.mktemp(f"sidecar-{cloud}")
    with serve_all(clouds=(cloud,)) as node:
        agent = SidecarAgent(root, node.environment(), watch=cloud)
        trainee = start_trainee(root, agent)
        try:
            agent.wait_for("training process connected")
            inject_notice(cloud, node.endpoints()[cloud], 20)
            out, _ = trainee.communicate(timeout=60)
            agent.wait_for("emergency checkpoint acknowledged")
            time.sleep(0.5)
            running = agent.process.poll() is None
            yield {"root": root, "agent": agent, "trainee_rc": trainee.returncode, "out": out,
                   "agent_running_after": running, "agent_rc": agent.stop()}
        finally:
            _end(trainee, signal.SIGKILL)
            agent.stop()


def test_a_notice_stops_the_training_process_at_a_durable_checkpoint(preempted):
    """On a spot notice the training process it did not start checkpoints, sees should_stop and exits 0."""
    assert preempted["trainee_rc"] == 0, preempted["out"]
    step = stopped_step(preempted["out"])
    assert restorable_step(preempted["root"], preempted["agent"]) == step


def test_the_agent_logs_the_acknowledgement_with_step_and_durable_flag(preempted):
    """The agent logs the training process's acknowledgement: the step it stopped at, and that it is durable."""
    ack = preempted["agent"].wait_for("emergency checkpoint acknowledged")
    assert ack["step"] == stopped_step(preempted["out"])
    assert ack["durable"] is True


def test_after_the_emergency_stop_the_agent_runs_until_sigterm_and_exits_0(preempted):
    """The agent outlives the training process it protected, and exits 0 when the platform stops it."""
    assert preempted["agent_running_after"] and preempted["agent_rc"] == 0


def test_a_notice_with_nobody_connected_is_logged_and_the_agent_keeps_serving(tmp_path: Path):
    """With no training process connected, a notice is logged as reaching nobody and the agent keeps serving."""
    with serve_all(clouds=("aws",)) as node:
        agent = SidecarAgent(tmp_path, node.environment(), watch="aws")
        try:
            inject_notice("aws", node.endpoints()["aws"], 20)
            line = agent.wait_for("no training process is connected")
            time.sleep(1.0)
            assert agent.process.poll() is None
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(agent.socket))
        finally:
            code = agent.stop()
    assert line["level"] == "warning" and "process namespace" in line["event"]
    assert code == 0


def test_a_maintenance_notice_takes_a_checkpoint_and_training_goes_on(tmp_path: Path):
    """A GCP maintenance notice asks for an opportunistic checkpoint; the training process keeps running."""
    with serve_all(clouds=("gcp",)) as node:
        agent = SidecarAgent(tmp_path, node.environment(), watch="gcp")
        trainee = start_trainee(tmp_path, agent)
        try:
            agent.wait_for("training process connected")
            node["gcp"].set_maintenance_event("TERMINATE_ON_HOST_MAINTENANCE")
            committed = agent.wait_for("checkpoint committed")
            time.sleep(0.5)
            assert trainee.poll() is None
        finally:
            _end(trainee, signal.SIGKILL)
            agent.stop()
    assert committed["emergency"] is False and committed["step"] > 0


def test_sigterm_makes_the_agent_exit_0(tmp_path: Path):
    """SIGTERM (the platform stopping the sidecar) makes the agent exit 0 promptly and remove its socket."""
    agent = SidecarAgent(tmp_path, {}, watch="off")
    started = time.monotonic()
    code = agent.stop()
    assert code == 0 and time.monotonic() - started < 5
    assert not agent.socket.exists()


def test_runner_log_stderr_puts_the_json_log_on_stderr(tmp_path: Path):
    """With RUNNER_LOG_STDERR=1 the agent's JSON log lines also go to stderr, where container logs look."""
    agent = SidecarAgent(tmp_path, {"RUNNER_LOG_STDERR": "1"}, watch="off")
    agent.stop()
    stderr = agent.process.stderr.read().decode()
    events = [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]
    assert "sidecar serving the control channel" in events
    assert events == [line["event"] for line in agent.lines()]


def test_an_unusable_log_file_sends_the_log_to_stderr(tmp_path: Path):
    """When its log file cannot be opened, the agent logs to stderr instead, saying so first, and still runs."""
    (tmp_path / "agent.jsonl").mkdir()  # a folder where the log file should be
    scratch = tmp_path / "shared"
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"mode": "sidecar", "scratch_dir": str(scratch), "watch": "off"}))
    process = subprocess.Popen([sys.executable, "-m", "runner.cli.main", "agent", "--config", str(config)],
                               env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (scratch / "control.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        code = _end(process)
    events = [json.loads(line)["event"] for line in process.stderr.read().decode().splitlines()
              if line.startswith("{")]
    assert code == 0
    assert events[0] == "log file unusable; logging to stderr only"
    assert "sidecar serving the control channel" in events


# --- with a controller ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """A sidecar with a controller's URL and token, through a preemption of a training process it did not start."""
    root = tmp_path_factory.mktemp("sidecar-controller")
    token = secrets.token_hex(16)
    marker = root / "the-agent-ran-the-job"
    api = FakeAgentAPI(token, assignment(f"touch {marker}", root / "durable"))
    with serve_all(clouds=("aws",)) as node:
        agent = SidecarAgent(root, node.environment(), watch="aws", controller_url=api.url, token=token,
                             node_id="n-sidecar", heartbeat_seconds=0.2)
        trainee = start_trainee(root, agent)
        try:
            agent.wait_for("registered")
            agent.wait_for("training process connected")
            inject_notice("aws", node.endpoints()["aws"], 20)
            out, _ = trainee.communicate(timeout=60)
            exit_report = api.wait_for("/v1/agent/exit")
            yield {"api": api, "out": out, "exit": exit_report, "marker": marker}
        finally:
            _end(trainee, signal.SIGKILL)
            agent.stop()
            api.close()


def test_with_a_controller_the_sidecar_never_runs_the_job(reported):
    """A registered sidecar heartbeats but never runs the assignment's setup or run command."""
    assert reported["api"].bodies("/v1/agent/register") and reported["api"].bodies("/v1/agent/heartbeat")
    assert not reported["marker"].exists()


def test_with_a_controller_the_sidecar_reports_notice_checkpoint_and_preemption(reported):
    """The notice, the durable emergency checkpoint and the preemption at that step reach the controller."""
    step = stopped_step(reported["out"])
    events = reported["api"].bodies("/v1/agent/events")
    assert [e["data"]["action"] for e in events if e["kind"] == "notice"] == ["terminate"]
    assert {"step": step, "durable": True, "emergency": True} in [
        {k: e["data"][k] for k in ("step", "durable", "emergency")} for e in events if e["kind"] == "checkpoint"]
    assert reported["exit"]["reason"] == "preempted" and reported["exit"]["exit_code"] is None
    assert f"step {step}, durable" in reported["exit"]["message"]


class ProtocolTrainee:
    """A training process as the control channel sees it: a connection that says hello, and later closed."""

    def __init__(self, agent: SidecarAgent, pid: int):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(agent.socket))
        self.send({"op": "hello", "pid": pid, "job_id": "j-notify", "attempt": 1})

    def send(self, message: dict) -> None:
        self.sock.sendall((json.dumps(message) + "\n").encode())


@contextlib.contextmanager
def sidecar_with_controller(tmp_path: Path):
    """A sidecar agent registered with a fake controller API; yields (agent, api)."""
    token = secrets.token_hex(16)
    api = FakeAgentAPI(token, assignment("true", tmp_path / "durable"))
    agent = SidecarAgent(tmp_path, {}, watch="off", controller_url=api.url, token=token, node_id="n-sidecar",
                         heartbeat_seconds=0.2)
    try:
        agent.wait_for("registered")
        yield agent, api
    finally:
        agent.stop()
        api.close()


def test_with_a_controller_the_sidecar_reports_the_end_once_every_training_process_closed(tmp_path: Path):
    """`closed` from every connected Checkpointer ends the attempt as succeeded, not lost later; one is not enough."""
    with sidecar_with_controller(tmp_path) as (agent, api):
        ranks = [ProtocolTrainee(agent, pid) for pid in (101, 102)]
        deadline = time.monotonic() + 30
        while len([line for line in agent.lines() if line["event"] == "training process connected"]) < 2:
            assert time.monotonic() < deadline, "the agent never saw both training processes connect"
            time.sleep(0.05)
        ranks[0].send({"op": "closed"})
        agent.wait_for("a training process closed its Checkpointer; waiting for the others")
        assert not api.bodies("/v1/agent/exit")
        ranks[1].send({"op": "closed"})
        exit_report = api.wait_for("/v1/agent/exit")
        assert exit_report["reason"] == "succeeded" and exit_report["exit_code"] is None
        assert "closed its Checkpointer" in exit_report["message"]


def test_a_checkpointer_closed_by_an_exception_ends_the_attempt_as_failed(tmp_path: Path):
    """`closed` with error: true (the with-block raised) is reported as a failure, not a success."""
    with sidecar_with_controller(tmp_path) as (agent, api):
        trainee = ProtocolTrainee(agent, 101)
        agent.wait_for("training process connected")
        trainee.send({"op": "closed", "step": 4, "error": True})
        exit_report = api.wait_for("/v1/agent/exit")
        assert exit_report["reason"] == "failed" and "after an exception" in exit_report["message"]
