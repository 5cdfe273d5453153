"""sd_notify: the module against a real datagram socket, and the two daemons under a pretend service manager."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml
from notify_fixtures import FakeAgentAPI, NotifySocket, assignment

from runner.sdnotify import Notifier


@pytest.fixture
def manager(tmp_path: Path):
    sock = NotifySocket(str(tmp_path / "notify.sock"))
    yield sock
    sock.close()


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNNER_", "NOTIFY_", "WATCHDOG_"))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# --- the module ------------------------------------------------------------------------------------------

def test_ready_reaches_a_socket_path(manager):
    """ready() sends READY=1 to the socket path in NOTIFY_SOCKET."""
    assert Notifier.from_environ({"NOTIFY_SOCKET": str(manager.sock.getsockname())}).ready()
    manager.wait_for("READY=1", timeout=5)


def test_ready_reaches_an_abstract_address():
    """An address starting with '@' is the abstract socket of that name."""
    name = f"runner-test-{secrets.token_hex(6)}"
    sock = NotifySocket(b"\0" + name.encode())
    try:
        assert Notifier(f"@{name}").ready()
        sock.wait_for("READY=1", timeout=5)
    finally:
        sock.close()


def test_stopping_is_sent(manager):
    """stopping() sends STOPPING=1."""
    assert Notifier(str(manager.sock.getsockname())).stopping()
    manager.wait_for("STOPPING=1", timeout=5)


def test_status_is_one_line(manager):
    """status() sends one STATUS= line, with the text's newlines folded into spaces."""
    assert Notifier(str(manager.sock.getsockname())).status("draining\n3 nodes left")
    manager.wait_for("STATUS=draining 3 nodes left", timeout=5)


def test_nothing_happens_without_notify_socket():
    """Without NOTIFY_SOCKET every call is a no-op and no watchdog thread starts."""
    notifier = Notifier.from_environ({"WATCHDOG_USEC": "1000000"})
    assert notifier.ready() is False
    assert notifier.start_watchdog() is None


def test_a_missing_manager_is_not_an_error(tmp_path: Path):
    """A socket nobody listens on makes ready() return False instead of raising."""
    assert Notifier(str(tmp_path / "nobody.sock")).ready() is False


def test_watchdog_pings_every_half_interval(manager):
    """With WATCHDOG_USEC=200ms the pinger sends WATCHDOG=1 about every 100 ms until stopped."""
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": str(manager.sock.getsockname()), "WATCHDOG_USEC": "200000"})
    watchdog = notifier.start_watchdog()
    first = manager.wait_for("WATCHDOG=1", timeout=5)
    fifth = manager.wait_for("WATCHDOG=1", count=5, timeout=5)
    watchdog.stop()
    assert 0.3 <= fifth - first <= 2.0
    time.sleep(0.2)
    settled = manager.received("WATCHDOG=1")
    time.sleep(0.3)
    assert manager.received("WATCHDOG=1") == settled


def test_watchdog_meant_for_another_process_is_left_alone(manager):
    """WATCHDOG_PID naming another process means this one does not ping."""
    env = {"NOTIFY_SOCKET": str(manager.sock.getsockname()), "WATCHDOG_USEC": "200000"}
    assert Notifier.from_environ({**env, "WATCHDOG_PID": str(os.getpid() + 1)}).start_watchdog() is None
    ours = Notifier.from_environ({**env, "WATCHDOG_PID": str(os.getpid())}).start_watchdog()
    assert ours is not None
    ours.stop()


def test_children_do_not_inherit_the_notify_socket(manager):
    """The first call takes NOTIFY_SOCKET out of os.environ, so processes the daemon starts cannot speak for it."""
    code = "import os; from runner import sdnotify; sdnotify.ready(); print(os.environ.get('NOTIFY_SOCKET'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env=_clean_env(NOTIFY_SOCKET=str(manager.sock.getsockname())))
    assert result.returncode == 0, result.stderr
    manager.wait_for("READY=1", timeout=5)
    assert result.stdout.strip() == "None"


# --- the controller -------------------------------------------------------------------------------------

def _start_controller(home: Path, manager: NotifySocket, **extra: str) -> subprocess.Popen:
    env = _clean_env(RUNNER_HOME=str(home), NOTIFY_SOCKET=str(manager.sock.getsockname()), **extra)
    return subprocess.Popen([sys.executable, "-m", "runner.cli.main", "server", "--data-dir", str(home),
                             "--port", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def test_controller_is_serving_when_it_says_ready(home: Path, manager):
    """`runner server` sends READY=1 only once its HTTP API answers."""
    process = _start_controller(home, manager)
    try:
        manager.wait_for("READY=1")
        url = json.loads((home / "controller.json").read_text())["url"]
        token = (home / "admin-token").read_text().strip()
        reply = requests.get(url + "/v1/health", headers={"Authorization": f"Bearer {token}"}, timeout=2)
        assert reply.status_code == 200
    finally:
        _stop(process)


def test_controller_says_stopping_on_sigterm(home: Path, manager):
    """SIGTERM makes `runner server` send STOPPING=1 and exit cleanly."""
    process = _start_controller(home, manager)
    try:
        manager.wait_for("READY=1")
        process.send_signal(signal.SIGTERM)
        manager.wait_for("STOPPING=1", timeout=20)
        assert process.wait(20) == 0
    finally:
        _stop(process)


def test_controller_pings_the_watchdog(home: Path, manager):
    """`runner server` with WATCHDOG_USEC set sends WATCHDOG=1 every half interval."""
    process = _start_controller(home, manager, WATCHDOG_USEC="400000")
    try:
        manager.wait_for("READY=1")
        first = manager.wait_for("WATCHDOG=1")
        fourth = manager.wait_for("WATCHDOG=1", count=4, timeout=10)
        assert fourth - first < 3.0
    finally:
        _stop(process)


# --- the agent ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    """One `runner agent` attempt against a loopback agent API, with a notify socket and a 400 ms watchdog."""
    root = tmp_path_factory.mktemp("agent")
    token = secrets.token_hex(16)
    api = FakeAgentAPI(token, assignment('sleep 1; echo "notify=${NOTIFY_SOCKET:-unset}"', root / "durable"))
    manager = NotifySocket(str(root / "notify.sock"))
    (root / "node" / "scratch").mkdir(parents=True)  # the bootstrap (or the local provider) makes it
    config = root / "agent.yaml"
    config.write_text(yaml.safe_dump({"controller_url": api.url, "node_id": "n-notify", "token": token,
                                      "scratch_dir": str(root / "node" / "scratch"), "watch": "off",
                                      "heartbeat_seconds": 0.2}))
    env = _clean_env(NOTIFY_SOCKET=str(root / "notify.sock"), WATCHDOG_USEC="400000")
    process = subprocess.Popen([sys.executable, "-m", "runner.cli.main", "agent", "--config", str(config)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        code = process.wait(60)
        yield {"api": api, "manager": manager, "code": code, "stdout": process.stdout.read().decode()}
    finally:
        _stop(process)
        manager.close()
        api.close()


def test_agent_says_ready_after_registering(agent_run):
    """`runner agent` sends READY=1 once the controller has answered its registration, before the job ends."""
    assert agent_run["code"] == 0, agent_run["stdout"]
    ready = agent_run["manager"].wait_for("READY=1", timeout=1)
    assert agent_run["api"].answered["/v1/agent/register"] < ready < agent_run["api"].answered["/v1/agent/exit"]


def test_agent_says_stopping_after_reporting_the_exit(agent_run):
    """`runner agent` sends STOPPING=1 once it has reported the job's exit."""
    stopping = agent_run["manager"].wait_for("STOPPING=1", timeout=1)
    assert stopping > agent_run["api"].answered["/v1/agent/exit"]


def test_agent_pings_the_watchdog(agent_run):
    """`runner agent` with WATCHDOG_USEC set pings while the job runs."""
    assert agent_run["manager"].received("WATCHDOG=1") >= 3


def test_job_does_not_inherit_the_notify_socket(agent_run):
    """The training job's environment has no NOTIFY_SOCKET: it cannot speak for the agent."""
    assert "notify=unset" in agent_run["api"].output.decode()
