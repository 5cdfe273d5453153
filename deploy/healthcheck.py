#!/usr/bin/env python3
"""Container health check for either daemon of the runner image (installed as ``runner-healthcheck``).

    runner-healthcheck                            # check whichever daemon is PID 1 (the image's HEALTHCHECK)
    runner-healthcheck server [--data-dir DIR]    # the controller's API answers /v1/health
    runner-healthcheck agent [--config FILE]      # the agent's control channel accepts a connection

Exit 0 when healthy, 1 otherwise, with one line saying why.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.request
from pathlib import Path


def option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def daemon_argv(cmdline: bytes) -> list[str]:
    """The arguments after the `runner` program in a /proc cmdline (through python, or an init such as tini)."""
    argv = [part.decode() for part in cmdline.split(b"\0") if part]
    for i, arg in enumerate(argv):
        if Path(arg).name == "runner":
            return argv[i + 1:]
    return []


def check_server(argv: list[str]) -> str | None:
    data_dir = Path(option(argv, "--data-dir") or os.environ.get("RUNNER_HOME") or "~/.runner").expanduser()
    try:
        url = json.loads((data_dir / "controller.json").read_text())["url"]
        token = (data_dir / "admin-token").read_text().strip()
    except (OSError, ValueError, KeyError) as exc:
        return f"no running controller recorded in {data_dir} ({exc})"
    request = urllib.request.Request(url + "/v1/health", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=4):
            return None
    except OSError as exc:
        return f"the controller at {url} does not answer /v1/health ({exc})"


def check_agent(argv: list[str]) -> str | None:
    from agents.config import AgentConfigError, load_agent_config

    try:
        config = load_agent_config(Path(option(argv, "--config") or "/etc/runner/agent.yaml"))
    except AgentConfigError as exc:
        return str(exc)
    path = config.control_socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(4)
        try:
            sock.connect(str(path))
        except OSError as exc:
            return f"the agent's control channel {path} does not accept connections ({exc.strerror or exc})"
    return None


def main(argv: list[str]) -> int:
    if not argv:
        argv = daemon_argv(Path("/proc/1/cmdline").read_bytes())
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    checks = {"server": check_server, "agent": check_agent}
    if command not in checks:
        print(f"unhealthy: cannot tell which daemon to check from {argv!r}; pass `server` or `agent`")
        return 1
    problem = checks[command](argv)
    if problem:
        print(f"unhealthy: {problem}")
        return 1
    print(f"healthy: {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
