"""The control channel: a test-side agent on a Unix socket asks for checkpoints and sees the events."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from structlog.testing import capture_logs

from runner.protocol.framing import decode, encode
from runner.protocol.messages import CheckpointRequest, parse


class FakeAgent:
    """The agent's end of the protocol: accepts one connection, records every line, sends what it is told."""

    def __init__(self, path) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.messages: list[dict] = []
        self.conn = None
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.conn, _ = self.server.accept()
        self._connected.set()
        buffer = b""
        while data := self._recv():
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            self.messages.extend(json.loads(line) for line in lines)

    def _recv(self) -> bytes:
        try:
            return self.conn.recv(65536)
        except OSError:  # closed by close() at the test's end
            return b""

    def send(self, message: dict) -> None:
        assert self._connected.wait(5)
        self.conn.sendall(encode(message))

    def wait_for(self, op: str, count: int = 1, timeout: float = 120.0) -> list[dict]:
        """The messages of ``op`` once ``count`` came; generous: a process started ahead says ``waiting`` only once
        its manifest is worked out (up to a minute on a busy machine)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [m for m in self.messages if m["op"] == op]
            if len(found) >= count:
                return found
            time.sleep(0.01)
        raise AssertionError(f"no {op!r} message; got {self.messages}")

    def close(self) -> None:
        if self.conn:
            self.conn.close()
        self.server.close()


@pytest.fixture
def agent(tmp_path, monkeypatch):
    path = tmp_path / "control.sock"
    fake = FakeAgent(path)
    monkeypatch.setenv("RUNNER_CONTROL", str(path))
    monkeypatch.setenv("RUNNER_JOB_ID", "job-1")
    monkeypatch.setenv("RUNNER_ATTEMPT", "2")
    yield fake
    fake.close()


def _train_until_stop(ckpt, setup, limit=500) -> int:
    step = ckpt.restore()
    while step < limit:
        setup.train(1)
        step += 1
        ckpt.step(step)
        if ckpt.should_stop:
            break
        time.sleep(0.002)
    return step


def test_hello_then_restored(setup, tmp_path, agent):
    """On connect the library says hello with pid, job id and attempt; restore() reports the step."""
    with setup.checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.restore()
    hello = agent.wait_for("hello")[0]
    assert (hello["job_id"], hello["attempt"], isinstance(hello["pid"], int)) == ("job-1", 2, True)
    assert agent.wait_for("restored")[0] == {"op": "restored", "step": 0, "manifest": None}


def test_stop_request_commits_durably_then_stops_the_loop(setup, tmp_path, agent):
    """checkpoint stop=true: 'committed' (durable) then 'stopping' arrive, and the loop exits on should_stop."""
    ckpt = setup.checkpointer(tmp_path / "ckpt", durable_url=f"file://{tmp_path / 'durable'}", interval="1h")
    agent.wait_for("hello")
    threading.Timer(0.2, agent.send, args=({"op": "checkpoint", "reason": "notice",
                                             "deadline": time.time() + 60, "stop": True},)).start()
    step = _train_until_stop(ckpt, setup)
    ckpt.close()
    assert ckpt.should_stop and step < 500
    committed = agent.wait_for("committed", count=2)
    # (either tier may come first: an emergency's upload starts from the staged buffer, beside the local write)
    assert sorted(c["durable"] for c in committed) == [False, True]
    assert all(c["step"] == step and c["emergency"] and c["bytes"] > 0 for c in committed)
    stopping = agent.wait_for("stopping")[0]
    assert stopping == {"op": "stopping", "step": step, "durable": True, "reason": "notice", "origin": "self"}
    ops = [(m["op"], m.get("durable")) for m in agent.messages]
    assert ops.index(("stopping", True)) > ops.index(("committed", True))
    assert (tmp_path / "durable" / f"step-{step:08d}" / "manifest.json").is_file()


def test_opportunistic_request_checkpoints_and_training_goes_on(setup, tmp_path, agent):
    """checkpoint stop=false takes a checkpoint at the next step and does not set should_stop."""
    with setup.checkpointer(tmp_path / "ckpt", interval="1h") as ckpt:
        agent.wait_for("hello")
        agent.send({"op": "checkpoint", "reason": "rebalance", "deadline": None, "stop": False})
        time.sleep(0.2)
        ckpt.step(1)
        ckpt.step(2)
        assert not ckpt.should_stop
    committed = agent.wait_for("committed")
    assert committed[0]["step"] == 1 and committed[0]["durable"] is False and not committed[0]["emergency"]


def test_an_unreachable_agent_is_one_warning(setup, tmp_path, monkeypatch):
    """A RUNNER_CONTROL path nobody listens on gives a warning; checkpointing still works."""
    monkeypatch.setenv("RUNNER_CONTROL", str(tmp_path / "nobody.sock"))
    with capture_logs() as logs, setup.checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(1)
        assert ckpt.wait()
    assert sum("control channel unreachable" in entry["event"] for entry in logs) == 1


def test_a_missed_deadline_stops_in_time_with_the_local_copy(setup, tmp_path, agent):
    """When the deadline leaves no time for the durable tier, the loop still stops, reporting durable=false."""
    ckpt = setup.checkpointer(tmp_path / "ckpt", durable_url="memory://ckpt-test-deadline", interval="1h")
    ckpt.stop_margin_s = 0.0
    agent.wait_for("hello")
    agent.send({"op": "checkpoint", "reason": "notice", "deadline": time.time() - 1, "stop": True})
    time.sleep(0.2)
    started = time.monotonic()
    ckpt.step(1)
    ckpt.close()
    assert ckpt.should_stop and time.monotonic() - started < 5
    assert agent.wait_for("stopping")[0]["op"] == "stopping"
    manifest = tmp_path / "ckpt" / "step-00000001" / "manifest.json"
    for _ in range(500):  # the local commit finishes in the background
        if manifest.is_file():
            break
        time.sleep(0.01)
    assert manifest.is_file()


def test_protocol_lines_round_trip():
    """encode/decode are newline-delimited JSON; non-objects and lines without an op are ignored."""
    line = encode({"op": "checkpoint", "reason": "drill", "deadline": 12.5, "stop": False})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse(decode(line)) == CheckpointRequest("drill", False, 12.5)
    assert decode(b"[1, 2]") is None and decode(b"not json") is None and decode(b'{"x": 1}') is None


def test_a_stop_request_outranks_an_opportunistic_one():
    """Two pending requests merge into the stronger: stop wins, with the earlier deadline."""
    merged = CheckpointRequest("rebalance", False, 50.0).merge(CheckpointRequest("notice", True, 80.0))
    assert merged == CheckpointRequest("notice", True, 50.0)


@pytest.mark.parametrize("reason", ["notice", "drill", "cancel", "move"])
def test_the_training_script_learns_why_it_stops(setup, tmp_path, agent, reason):
    """``ckpt.stop_reason`` is None while training goes on, then the reason of the request that stopped it."""
    ckpt = setup.checkpointer(tmp_path / "ckpt", interval="1h")
    agent.wait_for("hello")
    assert ckpt.stop_reason is None
    agent.send({"op": "checkpoint", "reason": reason, "deadline": time.time() + 60, "stop": True})
    _train_until_stop(ckpt, setup)
    ckpt.close()
    assert ckpt.should_stop and ckpt.stop_reason == reason
    assert agent.wait_for("stopping")[0]["reason"] == reason


QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "train.py"


@pytest.mark.parametrize("reason, said", [("drill", "for the resume drill"), ("cancel", "for a cancellation"),
                                          ("notice", "for a preemption")])
def test_the_quickstart_says_why_it_stops(tmp_path, agent, reason, said):
    """The quickstart's train.py names the stop's real reason, not a preemption for a drill or a cancel."""
    proc = subprocess.Popen([sys.executable, str(QUICKSTART), "--steps", "100000", "--step-time", "0.01"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        agent.wait_for("restored", timeout=120)
        agent.send({"op": "checkpoint", "reason": reason, "deadline": time.time() + 60, "stop": True})
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert re.search(rf"stopping at step \d+ {said}; the checkpoint is committed", out), out


def test_the_quickstart_takes_its_interval_from_its_job_file(tmp_path, monkeypatch):
    """One source for the quickstart's checkpoint interval (its job.yaml): train.py does not override it, so
    no 'the code's ... is used, not the job file's' line is logged."""
    import yaml

    job = yaml.safe_load((QUICKSTART.parent / "job.yaml").read_text())
    env = {**os.environ, "RUNNER_CHECKPOINT_INTERVAL": str(job["checkpoint"]["interval"])}
    out = subprocess.run([sys.executable, str(QUICKSTART), "--steps", "3", "--step-time", "0"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "checkpoint interval" not in out.stdout + out.stderr


def test_a_hold_commits_durably_and_the_loop_waits_there_until_stopped(setup, tmp_path, agent):
    """checkpoint hold=true (a notice's last seconds, the replacement not ready): the step is committed on
    the durable tier, 'holding' says so, and step() trains no further until the stop comes, which answers
    'stopping' at once with that same step."""
    ckpt = setup.checkpointer(tmp_path / "ckpt", durable_url=f"file://{tmp_path / 'durable'}", interval="1h")
    agent.wait_for("hello")
    agent.send({"op": "checkpoint", "reason": "notice", "deadline": time.time() + 60, "stop": False, "hold": True})
    time.sleep(0.2)
    trained = []

    def train() -> None:
        step = 0
        while step < 500 and not ckpt.should_stop:
            step += 1
            trained.append(step)
            ckpt.step(step)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    holding = agent.wait_for("holding")[0]
    held = holding["step"]
    assert holding["durable"] is True and (tmp_path / "durable" / f"step-{held:08d}" / "manifest.json").is_file()
    time.sleep(0.5)
    assert trained[-1] == held and thread.is_alive()  # no step after the held one
    agent.send({"op": "checkpoint", "reason": "notice", "deadline": time.time() + 60, "stop": True})
    thread.join(10)
    assert not thread.is_alive() and ckpt.should_stop and trained[-1] == held
    assert agent.wait_for("stopping")[0] == {"op": "stopping", "step": held, "durable": True, "reason": "notice",
                                             "origin": "self"}
    assert len(agent.wait_for("committed", count=2)) == 2  # the held step's local and durable commits, no more
    ckpt.close()


def test_a_stop_after_a_hold_says_the_held_step_is_durable_and_saves_nothing_more(tmp_path, agent, monkeypatch):
    """The replacement gets ready during a hold: the stop that follows has a few seconds left, fewer than a
    durable commit takes on this slow tier, but the held step is durable already. The library says so, warns
    of no missed deadline and starts no second save."""
    from runner.local_durable import throttle_environment

    for key, value in throttle_environment(1.0, tmp_path / "bucket").items():  # 1 MB/s: 2 MB take 2 s
        monkeypatch.setenv(key, value)
    model = torch.nn.Linear(2, 2)
    model.register_buffer("ballast", torch.zeros(500_000))  # 2 MB
    from runner.checkpoint import Checkpointer

    ckpt = Checkpointer(local_dir=tmp_path / "ckpt", durable_url=f"local-durable://{tmp_path / 'durable'}",
                        interval="1h", model=model)
    agent.wait_for("hello")
    agent.send({"op": "checkpoint", "reason": "notice", "deadline": time.time() + 60, "stop": False, "hold": True})
    time.sleep(0.2)  # the request is in before the first step (as in the test above)
    done = threading.Event()
    with capture_logs() as logs:
        def train() -> None:
            step = 0
            while step < 500 and not ckpt.should_stop:
                step += 1
                ckpt.step(step)
            done.set()

        threading.Thread(target=train, daemon=True).start()
        held = agent.wait_for("holding", timeout=60)[0]
        assert held["durable"] is True
        # The deadline leaves 1.5 s, less than the 2 s the held step's commit took.
        agent.send({"op": "checkpoint", "reason": "notice", "deadline": time.time() + 1.5, "stop": True})
        assert done.wait(30)
    assert agent.wait_for("stopping")[0]["step"] == held["step"]
    assert agent.wait_for("stopping")[0]["durable"] is True
    events = [entry["event"] for entry in logs]
    assert not [e for e in events if "miss the deadline" in e or "did not reach the durable tier" in e], events
    assert "this step is already durable: nothing more to save" in events
    assert len(agent.wait_for("committed", count=2)) == 2  # the held step's local and durable commits, no more
    ckpt.close()


def test_a_timing_checkpoint_is_saved_the_emergency_way_and_training_goes_on(setup, tmp_path, agent):
    """A notice's timing checkpoint: uploaded from the staged buffer as an emergency one is (its durable commit
    says so, and its time is what the agent sizes the emergency's lead on), not an emergency, no stop."""
    ckpt = setup.checkpointer(tmp_path / "ckpt", durable_url=f"file://{tmp_path / 'durable'}", interval="1h")
    agent.wait_for("hello")
    agent.send({"op": "checkpoint", "reason": "notice", "deadline": None, "stop": False, "timing": True})
    step = 0
    while not [m for m in agent.messages if m["op"] == "committed" and m["durable"]] and step < 100000:
        step += 1
        ckpt.step(step)
        time.sleep(0.01)
    durable = next(m for m in agent.messages if m["op"] == "committed" and m["durable"])
    assert durable["from_buffer"] is True and durable["emergency"] is False and durable["seconds"] > 0
    ckpt.step(step + 1)
    assert not ckpt.should_stop
    ckpt.close()
    assert all(not m["from_buffer"] for m in agent.messages if m["op"] == "committed" and m["step"] != durable["step"])


def test_a_released_hold_trains_on(setup, tmp_path, agent):
    """A false notice: the agent releases the hold and training goes on, with no stop."""
    ckpt = setup.checkpointer(tmp_path / "ckpt", durable_url=f"file://{tmp_path / 'durable'}", interval="1h")
    agent.wait_for("hello")
    agent.send({"op": "checkpoint", "reason": "notice", "deadline": time.time() + 60, "stop": False, "hold": True})
    time.sleep(0.2)
    threading.Timer(1.0, agent.send, args=({"op": "release"},)).start()
    ckpt.step(1)  # holds here until the release
    assert agent.wait_for("holding")[0]["step"] == 1
    ckpt.step(2)
    assert not ckpt.should_stop
    ckpt.close()


def test_a_process_started_ahead_waits_in_restore_for_the_handed_over_step(setup, tmp_path, agent, monkeypatch):
    """RUNNER_RESUME_WAIT=1 (a prepared replacement's process, started before its attempt exists): no attempt
    marker fences off the node still training; restore() says 'waiting' and blocks until 'resume' names the
    step, then restores exactly that step (not the newer one the old node committed meanwhile)."""
    monkeypatch.setenv("RUNNER_RESUME_STEP", "-")  # the library sets it once resumed: put back after the test
    monkeypatch.delenv("RUNNER_RESUME_STEP")
    durable = tmp_path / "durable"
    control = os.environ.pop("RUNNER_CONTROL")  # the old node: attempt 1, its own agent
    monkeypatch.setenv("RUNNER_ATTEMPT", "1")
    old = setup.checkpointer(tmp_path / "old", durable_url=f"file://{durable}", interval="1h")
    monkeypatch.setenv("RUNNER_CONTROL", control)
    monkeypatch.setenv("RUNNER_ATTEMPT", "2")
    setup.train(2)
    old.save(4)
    assert old.wait(60)
    weights = setup.weights()
    monkeypatch.setenv("RUNNER_RESUME_WAIT", "1")
    ahead = type(setup)(seed=5)
    ckpt = ahead.checkpointer(tmp_path / "new", durable_url=f"file://{durable}", interval="1h")
    marker = durable / "attempts" / "job-1" / "attempt-00000002"
    assert not marker.exists()  # the node on notice still commits
    setup.train(1)
    old.save(6)  # the old node commits a newer one while the new process waits
    assert old.wait(60)
    old.close()
    result = []
    thread = threading.Thread(target=lambda: result.append(ckpt.restore()), daemon=True)
    thread.start()
    assert agent.wait_for("waiting")
    time.sleep(0.3)
    assert thread.is_alive() and not result
    agent.send({"op": "resume", "step": 4, "attempt": 2})
    thread.join(30)
    assert result == [4] and all(torch.equal(a, b) for a, b in zip(ahead.weights(), weights))
    assert marker.is_file()  # marked once the attempt exists
    assert os.environ["RUNNER_RESUME_STEP"] == "4"
    ckpt.close()


def test_a_process_started_ahead_prepares_its_restore_while_it_waits(setup, tmp_path, agent, monkeypatch):
    """While a process started ahead waits, it works out its run manifest (hashing the installed packages takes
    a second or more) and makes ready the memory of the newest checkpoint on the node, so neither falls
    between the handover and the first step; the step handed over is still what it restores, bit-exact."""
    from runner.checkpoint import checkpointer, run_manifest
    from runner.checkpoint.warm_pool import WarmPool

    monkeypatch.setenv("RUNNER_RESUME_STEP", "-")  # the library sets it once resumed: put back after the test
    monkeypatch.delenv("RUNNER_RESUME_STEP")
    control = os.environ.pop("RUNNER_CONTROL")  # the old node's process, with an agent of its own
    with setup.checkpointer(tmp_path / "ckpt", interval="1h", keep=5) as old:
        old.save(3)
        setup.train(2)
        old.save(4)  # the step handed over, prefetched here
    weights = setup.weights()
    monkeypatch.setenv("RUNNER_CONTROL", control)
    manifest_worked_out = threading.Event()
    real = run_manifest.run_manifest

    def recorded(*args, **kwargs):
        manifest_worked_out.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(run_manifest, "run_manifest", recorded)
    pools = []

    class SeenPool(WarmPool):
        def __init__(self) -> None:
            super().__init__()
            pools.append(self)

    monkeypatch.setattr(checkpointer, "WarmPool", SeenPool)
    monkeypatch.setenv("RUNNER_RESUME_WAIT", "1")
    ahead = type(setup)(seed=5)
    ckpt = ahead.checkpointer(tmp_path / "ckpt", interval="1h")
    result = []
    thread = threading.Thread(target=lambda: result.append(ckpt.restore()), daemon=True)
    thread.start()
    assert agent.wait_for("waiting")
    assert manifest_worked_out.wait(60)  # before the word
    assert len(pools) == 1
    pools[0].join()
    assert pools[0].bytes > 0  # the memory of step 4's tensors, touched
    agent.send({"op": "resume", "step": 4, "attempt": 2})
    thread.join(60)
    assert result == [4] and all(torch.equal(a, b) for a, b in zip(ahead.weights(), weights))
    agent.wait_for("restored")  # (its reader thread may get it after restore() has returned)
    ops = [m["op"] for m in agent.messages]
    assert ops.index("manifest") < ops.index("restored")
    assert pools[0].bytes == 0  # the restore read into it
    ckpt.close()
