"""Finding the controller: RUNNER_SERVER/RUNNER_TOKEN, then config.yaml, else a local one started on demand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import click

from ..client import Client, ClientError, ControllerUnreachable
from ..home import ADMIN_TOKEN_FILE, CONTROLLER_FILE, LAST_PORT_FILE, ConfigError, load_config, runner_home
from ..private import private_dir
from ..protocol.urls import redact

START_TIMEOUT_SECONDS = 30.0
BAD_INPUT_EXIT = 2  # `runner server`'s exit code for a configuration it refused


def connect(start_if_needed: bool = True) -> Client:
    """A client for the configured controller, starting a local one when none is configured."""
    home = runner_home()
    config = load_config(home)
    url = os.environ.get("RUNNER_SERVER") or config.get("server")
    token = os.environ.get("RUNNER_TOKEN") or config.get("token")
    source = "RUNNER_TOKEN" if os.environ.get("RUNNER_TOKEN") else f"{home / 'config.yaml'}: token"
    if url:
        _check_url(url, "RUNNER_SERVER" if os.environ.get("RUNNER_SERVER") else f"{home / 'config.yaml'}: server")
        if not token:
            token, source = _read_token(home), str(home / ADMIN_TOKEN_FILE)
        if not token:
            # A controller that cannot be reached is exit 3 whatever the token; one that answers needs the token.
            Client(url, "", timeout=5).get("/healthz")
            raise ClientError(f"no token for {redact(url)}: set RUNNER_TOKEN (the admin token of that controller)")
        return Client(url, token, token_source=source)
    client = _local_client(home)
    if client is not None:
        return client
    if not start_if_needed:
        raise ControllerUnreachable(f"no local controller is running for {home}")
    return _start_local(home)


def _check_url(url: str, source: str) -> None:
    """A controller URL that no request could use is bad configuration (exit 2), named with where it was set."""
    for part in [u.strip() for u in url.split(",") if u.strip()] or [url]:
        try:
            parts = urlsplit(part)
            usable = parts.scheme in ("http", "https") and bool(parts.hostname)
            parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
        except ValueError:
            usable = False
        if not usable:
            raise ConfigError(f"{source}: {redact(part)!r} is not a controller URL; give http://HOST:PORT "
                              "(several separated by commas), e.g. http://127.0.0.1:8470")


def _read_token(home: Path) -> str | None:
    try:
        return (home / ADMIN_TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def _local_client(home: Path) -> Client | None:
    """A client for the local controller of ``home`` if it is up and answering."""
    try:
        info = json.loads((home / CONTROLLER_FILE).read_text())
    except (OSError, ValueError):
        return None
    token = _read_token(home)
    if not token:
        return None
    client = Client(info["url"], token, timeout=5)
    try:
        client.get("/v1/health")
    except ClientError:
        return None
    client.timeout = 30
    return client


def _start_local(home: Path) -> Client:
    private_dir(home)  # the controller keeps jobs' secrets here
    log_path = home / "controller.log"
    # Nodes know the controller by URL: reuse the last port so a restarted controller keeps its nodes.
    port = _last_port(home)
    process = _spawn_server(home, port, log_path)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        client = _local_client(home)
        if client is not None:
            click.echo(f"Started a local controller at {client.url} (data in {home}); "
                       "`runner server stop` stops it.", err=True)
            return client
        if process.poll() is not None and port and "already in use" in _last_line(log_path):
            port = 0  # someone else took the old port: any free one will do
            process = _spawn_server(home, port, log_path)
        elif process.poll() is not None:
            why = f"the local controller exited at start: {_last_line(log_path)} (full log: {log_path})"
            if process.returncode == BAD_INPUT_EXIT:  # config.yaml holds a value it refused: bad input
                raise ConfigError(why)
            raise ControllerUnreachable(why)
        time.sleep(0.1)
    raise ControllerUnreachable(f"the local controller did not answer within {START_TIMEOUT_SECONDS:.0f}s; "
                                f"see {log_path}")


def _spawn_server(home: Path, port: int, log_path: Path) -> subprocess.Popen:
    with open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "runner.cli.main", "server", "--data-dir", str(home), "--port", str(port)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )


def _last_port(home: Path) -> int:
    try:
        return int((home / LAST_PORT_FILE).read_text())
    except (OSError, ValueError):
        return 0


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no log"
