"""RUNNER_HOME: where the CLI keeps its config, and the local controller its data, token and pid."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from .errors import ConfigError  # noqa: F401 - its home before runner/errors.py; callers import it from here


def runner_home() -> Path:
    return Path(os.environ.get("RUNNER_HOME") or Path.home() / ".runner").expanduser()


def load_config(home: Path | None = None) -> dict:
    """``$RUNNER_HOME/config.yaml`` as a dict ({} when absent), checked (runner/config_file.py)."""
    path = (home or runner_home()) / "config.yaml"
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping with keys such as server: and clouds:")
    from .config_file import RunnerConfig  # pydantic: only where there is a file to check
    from .validation import validate

    validate(RunnerConfig, data, source=str(path), error=ConfigError)
    return data


def scheduler_settings(config: dict) -> dict:
    """``scheduler:`` of config.yaml, checked, in seconds: ``auto_on_demand_after`` and ``gang_timeout``."""
    raw = config.get("scheduler") or {}
    if not isinstance(raw, dict):
        raise ConfigError("config.yaml: scheduler: must be a mapping such as {auto_on_demand_after: 10m}")
    from .config_file import SchedulerConfig
    from .durations import parse_duration
    from .validation import validate

    checked = validate(SchedulerConfig, raw, where="scheduler", source="config.yaml", error=ConfigError)
    return {"auto_on_demand_after": parse_duration(checked.auto_on_demand_after),
            "gang_timeout": parse_duration(checked.gang_timeout)}


# Files of a local controller under its data dir.
ADMIN_TOKEN_FILE = "admin-token"
NODE_SECRET_FILE = "node-secret"  # node tokens are derived from it
CONTROLLER_FILE = "controller.json"  # {"url", "pid"} of the running controller
LOCK_FILE = "controller.lock"
LAST_PORT_FILE = "controller.port"  # the port the local controller last served on
