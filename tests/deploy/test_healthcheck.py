"""deploy/healthcheck.py, the image's health check, against a real controller and a real control channel."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from agents.control import ControlServer
from agents.config import control_socket_path

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "healthcheck.py"


def healthcheck(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**clean, **(env or {})})


def agent_config(tmp_path: Path) -> Path:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"controller_url": "http://127.0.0.1:9", "node_id": "n-health", "token": "t",
                                    "scratch_dir": str(scratch)}))
    return path


def cmdline(argv: list[str]) -> bytes:
    """What /proc/PID/cmdline holds: each argument NUL-terminated."""
    return b"".join(arg.encode() + b"\0" for arg in argv)


def test_a_serving_controller_is_healthy(controller):
    """`healthcheck server` exits 0 while the controller's API answers."""
    result = healthcheck("server", "--data-dir", str(controller.home))
    assert result.returncode == 0, result.stdout


def test_a_dead_controller_is_unhealthy(controller):
    """`healthcheck server` exits 1 once the controller process is gone, even if its files remain."""
    controller.kill(signal.SIGKILL)
    result = healthcheck("server", env={"RUNNER_HOME": str(controller.home)})
    assert result.returncode == 1 and "does not answer" in result.stdout


def test_a_listening_agent_is_healthy(tmp_path: Path):
    """`healthcheck agent` exits 0 when the agent's control channel accepts connections."""
    config = agent_config(tmp_path)
    server = ControlServer(control_socket_path(tmp_path / "scratch", "n-health"), lambda message: None).start()
    try:
        result = healthcheck("agent", "--config", str(config))
    finally:
        server.close()
    assert result.returncode == 0, result.stdout


def test_a_listening_standalone_sidecar_is_healthy(tmp_path: Path):
    """`healthcheck agent` accepts a sidecar's config, which names no controller, once its socket listens."""
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"mode": "sidecar", "scratch_dir": str(tmp_path / "shared")}))
    server = ControlServer(tmp_path / "shared" / "control.sock", lambda message: None).start()
    try:
        result = healthcheck("agent", "--config", str(config))
    finally:
        server.close()
    assert result.returncode == 0, result.stdout


def test_a_dead_agent_is_unhealthy(tmp_path: Path):
    """`healthcheck agent` exits 1 when the control socket is left behind by an agent that died."""
    config = agent_config(tmp_path)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(control_socket_path(tmp_path / "scratch", "n-health")))
    stale.close()
    result = healthcheck("agent", "--config", str(config))
    assert result.returncode == 1 and "does not accept connections" in result.stdout


def test_the_daemon_is_found_from_pid_1():
    """Without arguments the check reads the daemon from PID 1's command line, through python or an init."""
    spec = importlib.util.spec_from_file_location("healthcheck", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    python = ["/usr/local/bin/python", "/usr/local/bin/runner", "server", "--host", "0.0.0.0"]
    tini = ["/sbin/docker-init", "--", "runner", "agent", "--config", "/etc/a.yaml"]
    assert module.daemon_argv(cmdline(python)) == ["server", "--host", "0.0.0.0"]
    assert module.daemon_argv(cmdline(tini)) == ["agent", "--config", "/etc/a.yaml"]
