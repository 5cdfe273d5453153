"""RUNNER_HOME: where the CLI keeps its config, and the local controller its data, token and pid."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from .errors import ConfigError  # noqa: F401 - its home before runner/errors.py; callers import it from here


def runner_home() -> Path:
    return Path(os.environ.get("RUNNER_HOME") or Path.home() / ".runner").expanduser()


def load_config(home: Path | None = None) -> dict:
    """``$RUNNER_HOME/config.yaml`` as a dict ({} when absent)."""
    path = (home or runner_home()) / "config.yaml"
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping with keys such as server: and clouds:")
    unknown = set(data) - {"server", "token", "clouds", "scheduler"}
    if unknown:
        raise ConfigError(f"{path}: unknown key {sorted(unknown)[0]!r} (known: server, token, clouds, scheduler)")
    return data


def scheduler_settings(config: dict) -> dict:
    """``scheduler:`` of config.yaml, checked: ``auto_on_demand_after`` in seconds (default 10 minutes) and
    ``gang_timeout``, how long a multi-node job's nodes get to all register (default 10 minutes)."""
    from .durations import parse_duration

    raw = config.get("scheduler") or {}
    if not isinstance(raw, dict):
        raise ConfigError("config.yaml: scheduler: must be a mapping such as {auto_on_demand_after: 10m}")
    unknown = set(raw) - {"auto_on_demand_after", "gang_timeout"}
    if unknown:
        raise ConfigError(f"config.yaml: scheduler.{sorted(unknown)[0]}: unknown key "
                          "(known: auto_on_demand_after, gang_timeout)")
    try:
        after = parse_duration(raw.get("auto_on_demand_after", "10m"))
    except ValueError as exc:
        raise ConfigError(f"config.yaml: scheduler.auto_on_demand_after: {exc}") from None
    try:
        gang_timeout = parse_duration(raw.get("gang_timeout", "10m"))
    except ValueError as exc:
        raise ConfigError(f"config.yaml: scheduler.gang_timeout: {exc}") from None
    if gang_timeout <= 0:
        raise ConfigError("config.yaml: scheduler.gang_timeout: must be a positive duration such as 10m")
    return {"auto_on_demand_after": after, "gang_timeout": gang_timeout}


# Files of a local controller under its data dir.
ADMIN_TOKEN_FILE = "admin-token"
NODE_SECRET_FILE = "node-secret"  # node tokens are derived from it
CONTROLLER_FILE = "controller.json"  # {"url", "pid"} of the running controller
LOCK_FILE = "controller.lock"
LAST_PORT_FILE = "controller.port"  # the port the local controller last served on
